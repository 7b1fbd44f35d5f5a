"""kernels/gated_delta_rule_varlen.py: the chunked gated delta rule over every long sequence of
a step in one call. On the CPU the flash-linear-attention call is stood in for by the reference
run segment by segment, as fla's documentation defines it (``cu_seqlens``, ``[N, HV, K, V]``
states, L2 norm of q and k in the kernel, scale K ** -0.5): what is tested is our side of the
call (packing, head repeat for GVA, per-sequence states), which must give exactly the
sequence-by-sequence result. tests/test_gpu.py compares the real fla with the reference."""

from __future__ import annotations

import pytest
import torch

from mtpserve.kernels import gated_delta_rule_varlen as varlen
from mtpserve.kernels.gated_delta_rule import chunk_gated_delta_rule


def fake_fla(q, k, v, g, beta, *, initial_state, output_final_state, use_qk_l2norm_in_kernel,
             cu_seqlens):
    """fla's ``chunk_gated_delta_rule`` signature, computed by the reference per segment."""
    assert q.shape[0] == 1 and q.shape[2] == v.shape[2]   # one packed row, heads repeated
    assert output_final_state and use_qk_l2norm_in_kernel
    assert cu_seqlens.dtype == torch.int64 and g.dtype == torch.float32
    cu = cu_seqlens.tolist()
    outs, finals = [], []
    for n in range(len(cu) - 1):
        s, e = cu[n], cu[n + 1]
        o, f = chunk_gated_delta_rule(q[0, s:e], k[0, s:e], v[0, s:e], g[0, s:e],
                                      beta[0, s:e], initial_state[n])
        outs.append(o)
        finals.append(f)
    return torch.cat(outs)[None], torch.stack(finals)


def _inputs(lengths, hk=2, hv=4, dk=8, dv=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    r = lambda *shape: torch.randn(*shape, generator=gen)
    return (r(T, hk, dk), r(T, hk, dk), r(T, hv, dv), -torch.rand(T, hv, generator=gen),
            torch.rand(T, hv, generator=gen), r(len(lengths), hv, dk, dv))


def test_one_packed_call_equals_the_sequence_by_sequence_reference(monkeypatch):
    monkeypatch.setattr(varlen, "fla_chunk", lambda: fake_fla)
    lengths = [17, 130, 64]   # within a chunk of 64, across chunks, exactly one
    q, k, v, g, beta, states = _inputs(lengths)
    ref_out, ref_final = varlen.chunk_varlen(q, k, v, g, beta, states, lengths, name="torch")
    out, final = varlen.chunk_varlen(q, k, v, g, beta, states, lengths, name="fla")
    assert torch.equal(out, ref_out) and torch.equal(final, ref_final)
    o1, f1 = chunk_gated_delta_rule(q[17:147], k[17:147], v[17:147], g[17:147], beta[17:147],
                                    states[1])
    assert torch.equal(ref_out[17:147], o1) and torch.equal(ref_final[1], f1)


def test_the_backend_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("MTPSERVE_GDN_PREFILL", raising=False)
    assert varlen.backend() == "torch"
    monkeypatch.setenv("MTPSERVE_GDN_PREFILL", "fla")
    assert varlen.backend() == "fla"
    monkeypatch.setenv("MTPSERVE_GDN_PREFILL", "flash")
    with pytest.raises(ValueError, match="MTPSERVE_GDN_PREFILL must be one of"):
        varlen.backend()


def test_an_unusable_backend_stops_the_engine_at_start(monkeypatch, tmp_path):
    """``MTPSERVE_GDN_PREFILL`` is checked when the model is built, not at the first prefill:
    an unknown name, or fla without fla-core, fails there with a clear error."""
    import importlib.util

    from hybrid_checkpoint import random_mtp_checkpoint
    from mtpserve import LLM

    path = random_mtp_checkpoint(tmp_path / "tiny")[0]
    monkeypatch.setenv("MTPSERVE_GDN_PREFILL", "flash")
    with pytest.raises(ValueError, match="MTPSERVE_GDN_PREFILL must be one of"):
        LLM(str(path), dtype="float32", max_model_len=64, num_kv_blocks=32, block_size=4)
    if importlib.util.find_spec("fla") is None:
        monkeypatch.setenv("MTPSERVE_GDN_PREFILL", "fla")
        with pytest.raises(ImportError, match="fla"):
            LLM(str(path), dtype="float32", max_model_len=64, num_kv_blocks=32, block_size=4)


def test_a_hybrid_prefill_of_several_prompts_is_the_same_through_the_packed_call(monkeypatch,
                                                                                 tmp_path):
    """The engine on a tiny Qwen3-Next checkpoint: prompts long enough for the chunked form
    (more than 16 tokens) prefilled together give the same greedy tokens with the packed call
    (fake fla) as sequence by sequence."""
    from hybrid_checkpoint import random_mtp_checkpoint
    from mtpserve import LLM, SamplingParams

    path = random_mtp_checkpoint(tmp_path / "tiny")[0]
    llm = LLM(str(path), dtype="float32", max_model_len=256, num_kv_blocks=256, block_size=4,
              max_num_seqs=8)
    prompts = [[(5 * i + 3 * j) % 250 + 2 for j in range(20 + 23 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    runs, calls = {}, []
    monkeypatch.setattr(varlen, "fla_chunk",
                        lambda: (lambda *a, **kw: calls.append(kw["cu_seqlens"].tolist())
                                 or fake_fla(*a, **kw)))
    for name in ("torch", "fla"):
        monkeypatch.setenv("MTPSERVE_GDN_PREFILL", name)
        runs[name] = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    assert runs["fla"] == runs["torch"]
    assert [0, 20, 63, 129] in calls   # the three prompts in one call
