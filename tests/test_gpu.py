"""GPU tests (skipped without CUDA): Triton kernels against their references, CUDA-graph replay
against eager, greedy equality with speculation in bfloat16, hybrid models on the GPU."""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("hq, hkv, d", [(9, 3, 64), (32, 8, 128), (16, 2, 256), (4, 4, 80)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_triton_paged_attention_matches_reference(hq, hkv, d, dtype):
    """tests/attention_check.py with contexts up to 2100 keys: within 1e-5 / 1e-2 of float64,
    the pair kernel's fold bit-equal to the merge kernel's, row-invariant."""
    import sys
    sys.path.insert(0, "tests")
    import attention_check

    worst = attention_check.check_paged_attention("cuda", hq, hkv, d, dtype, big=True)
    assert set(worst) == {64, 256}


@pytest.mark.parametrize("hq, hkv, d", [(16, 8, 128), (16, 4, 128), (16, 2, 256)])
def test_early_kv_attention_gives_the_same_bits(hq, hkv, d):
    """paged_attention_triton.EARLY_KV in bfloat16 (tests/attention_check.py): with the loads
    before the PDL wait reading caches whose step positions hold other values, the same bits as
    without, at every parallel grid (6 cases); an older position changed is seen."""
    import sys
    sys.path.insert(0, "tests")
    import attention_check

    assert attention_check.check_early_kv("cuda", hq, hkv, d, "bfloat16") == 6


def test_early_kv_attention_in_a_model_under_pdl(tmp_path, monkeypatch):
    """A tiny Qwen3 (two layers, 4 KV heads of 128) through CUDA graphs with PDL, decode (one
    and two requests) and the K/V written by the kernel just before each attention: the greedy
    tokens and their logprobs exactly the same with paged_attention_triton.EARLY_KV on and off
    (a race on the step's own K/V would change them), and partial kernels launched with EARLY
    in the graphs captured when it is on (not the many-token graphs, which run the pair
    kernel), none when off."""
    from mtpserve import SamplingParams
    from mtpserve.kernels import paged_attention_triton as pa

    llm = _tiny_qwen3_llm(tmp_path)
    prompts = [[5, 9, 33, 2, 71] * 20, list(range(2, 140))]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=1)
    early, real = [], pa._partial_kernel

    class Spy:   # records each launch's EARLY
        def __getitem__(self, grid):
            return lambda *a, **kw: early.append(kw["EARLY"]) or real[grid](*a, **kw)

    monkeypatch.setattr(pa, "_partial_kernel", Spy())

    def outputs(on):
        with _switched(llm, pa, "EARLY_KV", on):
            assert (True in early) == on, early   # the graphs' captures (few tokens)
            res = [llm.generate(prompts[:1], params), llm.generate(prompts, params)]
            del early[:]
            return [[(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs])
                     for o in r] for r in res]

    del early[:]
    off = outputs(False)
    del early[:]
    on = outputs(True)
    assert on == off


def _greedy(llm, prompts, n=48):
    from mtpserve import SamplingParams

    res = llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    return [r.outputs[0].token_ids for r in res]


def _chat(tok, texts):
    return [list(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=True,
                                         add_generation_prompt=True, return_dict=False))
            for t in texts]


# bf16 hidden states of a 1-token and a 4-token pass differ in their last bits; a greedy flip
# between them is numerics only where the target's top-2 logits (float32) are this close
# (measured: flips at margins 0.013, 0.08 and 0.196 on the H200; none above)
NEAR_TIE = 0.25

TEXTS = ["What is the capital of France?", "Write a Python function that reverses a string.",
         "Repeat this list exactly three times: apple, banana, cherry, date.",
         "Count from 1 to 30, separated by commas.", "Why is the sky blue?",
         "Explique la photosynthèse en une phrase."]


def _margin_report(llm, prompt, ours, ref):
    """Top-2 logit margin (bf16 target) at the first divergence, for the failure message."""
    import sys
    sys.path.insert(0, "tests")
    from harness import logits_of_prompt

    i = next(j for j, (a, b) in enumerate(zip(ours, ref)) if a != b)
    logits = logits_of_prompt(llm.engine, prompt + ref[: i + 1])[len(prompt) + i - 1]
    top = logits.float().topk(2).values
    return i, float(top[0] - top[1])


@pytest.fixture(scope="module")
def smol_graphs():
    from mtpserve import LLM

    return LLM(None, dtype="bfloat16", max_model_len=1024, gpu_memory_utilization=0.3)


def test_graph_replay_equals_eager(smol_graphs):
    from mtpserve import LLM

    assert smol_graphs.engine.runner.graphs is not None
    eager = LLM(None, dtype="bfloat16", max_model_len=1024, gpu_memory_utilization=0.3,
                enforce_eager=True)
    prompts = _chat(eager.tokenizer, TEXTS)
    a, b = _greedy(smol_graphs, prompts), _greedy(eager, prompts)
    flips = [(_margin_report(eager, p, x, y)) for p, x, y in zip(prompts, a, b) if x != y]
    assert all(m < NEAR_TIE for _, m in flips), f"divergences (token, top-2 margin): {flips}"


@pytest.mark.parametrize("algo", ["ngram", "forced_accept", "forced_reject"])
def test_greedy_equal_with_speculation_bf16(smol_graphs, algo):
    from mtpserve import LLM

    llm = LLM(None, dtype="bfloat16", max_model_len=1024, gpu_memory_utilization=0.3,
              speculative_algorithm=algo, speculative_num_steps=3, speculative_adaptive=False)
    prompts = _chat(llm.tokenizer, TEXTS)
    a, b = _greedy(llm, prompts), _greedy(smol_graphs, prompts)
    flips = [(_margin_report(smol_graphs, p, x, y)) for p, x, y in zip(prompts, a, b) if x != y]
    # bf16: a 4-token verify and a 1-token decode round differently; only near-ties may flip
    assert all(m < NEAR_TIE for _, m in flips), f"divergences (token, top-2 margin): {flips}"
    print(f"{algo}: {len(flips)} of {len(prompts)} outputs diverge at near-ties {flips}")
    if algo == "forced_reject":
        assert llm.engine.spec_metrics.num_accepted_tokens == 0


def test_self_draft_replays_graphs_of_its_own(smol_graphs):
    from mtpserve import LLM

    llm = LLM(None, dtype="bfloat16", max_model_len=1024, gpu_memory_utilization=0.3,
              speculative_algorithm="draft", speculative_draft_model_path="self",
              speculative_num_steps=3, speculative_adaptive=False)
    assert llm.engine.proposer.runner.graphs is not None
    prompts = _chat(llm.tokenizer, TEXTS)
    a, b = _greedy(llm, prompts), _greedy(smol_graphs, prompts)
    flips = [(_margin_report(smol_graphs, p, x, y)) for p, x, y in zip(prompts, a, b) if x != y]
    assert all(m < NEAR_TIE for _, m in flips), f"divergences (token, top-2 margin): {flips}"


@pytest.mark.parametrize("shared", [48, 32])
def test_hybrid_model_on_cuda_matches_cpu(tmp_path, shared):
    """Greedy tokens on CUDA (graphs, eager, MTP, n-gram) equal the CPU's; shared expert 32
    wide as the experts: folded into them on CUDA, its choices summed by the next norm."""
    import sys
    sys.path.insert(0, "tests")
    from harness_hybrid import random_mtp_weights, tiny_hybrid_hf
    from hybrid_checkpoint import write_checkpoint

    from mtpserve import LLM

    hf, _ = tiny_hybrid_hf("qwen3_next", mtp_num_hidden_layers=1,
                           shared_expert_intermediate_size=shared)
    path = str(write_checkpoint(tmp_path / "tiny", hf, random_mtp_weights(hf)))
    prompts = [[5, 9, 33, 2, 71], list(range(2, 40)), [100, 101, 102] * 5]
    kw = dict(dtype="float32", max_model_len=256, num_kv_blocks=64, block_size=16)
    cpu = _greedy(LLM(path, device="cpu", **kw), prompts, 16)
    plain = LLM(path, device="cuda", **kw)
    eager = LLM(path, device="cuda", enforce_eager=True, **kw)
    spec = LLM(path, device="cuda", speculative_algorithm="nextn", speculative_adaptive=False,
               **kw)
    # decode graphs per (sequences, query length); verify graphs for 1 + k; MTP forwards too
    assert (1, 1) in plain.engine.runner.graphs.graphs
    assert (1, 4) in spec.engine.runner.graphs.graphs
    assert spec.engine.proposer.runner.graphs.graphs
    assert _greedy(plain, prompts, 16) == cpu
    assert _greedy(eager, prompts, 16) == cpu
    assert _greedy(spec, prompts, 16) == cpu
    alone = [_greedy(spec, [p], 16)[0] for p in prompts]
    assert alone == cpu
    # n-gram drafts come and go per request: steps of mixed query lengths replay padded graphs
    ngram = LLM(path, device="cuda", speculative_algorithm="ngram", speculative_adaptive=False,
                **kw)
    assert _greedy(ngram, prompts, 16) == cpu


def test_mtp_chain_graph_replays_equal_the_eager_chain():
    """The greedy MTP draft chain captured per (rows, steps) (spec/mtp_chain_graph.py) on the
    qwen3-next-3b random shape, bf16, k = 3: every replay's drafts equal the eager chain run over
    a copy of the same static inputs (same shapes, so the same kernels: exact ids). Budgets 0..3
    mixed in every step (tests/harness_mtp_chain.py); 6 requests finishing one after another, so
    6..1 rows replay the 8-, 4-, 2- and 1-row graphs, padded."""
    import sys
    sys.path.insert(0, "tests")
    from harness_mtp_chain import Budgets

    from mtpserve import SamplingParams
    from mtpserve.bench.random_model import random_model_files
    from mtpserve.config import EngineConfig, SpeculativeConfig
    from mtpserve.engine.engine import LLMEngine
    from mtpserve.spec.mtp_chain import ChainInputs

    cfg = EngineConfig(dtype="bfloat16", device="cuda", max_model_len=1024, max_num_seqs=8,
                       gpu_memory_utilization=0.4,
                       speculative=SpeculativeConfig("nextn", num_steps=3, adaptive=False))
    eng = LLMEngine(cfg, files=random_model_files("qwen3-next-3b"))
    eng.proposer.policy = Budgets(3)
    # every chain through ChainGraphs.run (drafting ahead replays them through run_variants;
    # test_mtp_drafts_ahead_with_graphs_as_without covers that)
    eng.proposer.draft_ahead = False
    chain, graphs = eng.proposer.chain, eng.proposer.chain.graphs
    assert set(graphs.graphs) == {(p, m) for p in (1, 2, 4, 8) for m in (1, 2, 3)}
    seen, run = [], graphs.run

    def checked(hidden, plan):
        out = run(hidden, plan).clone()
        P, m = plan.padded, plan.steps
        g = graphs.graphs[(P, m)]
        inputs = (ChainInputs.view(g.i64.clone(), g.i32.clone(), graphs.tables[:P].clone(), P,
                                   m) if m > 1 else None)
        eager = chain.forward(g.hidden.clone(), inputs, m)[:plan.rows]
        seen.append((plan.rows, P, m, out.tolist(), eager.tolist()))
        return out

    graphs.run = checked
    for i, n in enumerate((6, 9, 12, 15, 18, 22)):
        eng.add_request(f"r{i}", [(37 * i + 11 * j) % 150000 + 2 for j in range(20 + 9 * i)],
                        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    bad = [s for s in seen if s[3] != s[4]]
    assert not bad, f"{len(bad)} of {len(seen)} replays differ from the eager chain: {bad[:3]}"
    assert {P for _, P, *_ in seen} == {8, 4, 2, 1} and any(b < P for b, P, *_ in seen)
    assert {m for _, _, m, *_ in seen} >= {2, 3}


def test_mtp_chain_graphs_draft_as_the_step_loop(tmp_path):
    """Tiny hybrid (float32) on CUDA with its MTP layer: drafting through the captured chain
    graphs gives, step after step, the drafts of the step-by-step loop (use_chain off), with
    budgets 0..3 mixed in every step; both generate the CPU's plain greedy tokens."""
    import sys
    sys.path.insert(0, "tests")
    from harness_hybrid import random_mtp_weights, tiny_hybrid_hf
    from harness_mtp_chain import mtp_llm
    from hybrid_checkpoint import write_checkpoint

    from mtpserve import LLM, SamplingParams

    hf, _ = tiny_hybrid_hf("qwen3_next", mtp_num_hidden_layers=1)
    path = str(write_checkpoint(tmp_path / "tiny", hf, random_mtp_weights(hf)))
    prompts = [[5, 9, 33, 2, 71], list(range(2, 40)), [100, 101, 102] * 5, [7] * 3,
               list(range(60, 3, -3))]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
              for n in (8, 11, 14, 17, 20)]
    kw = dict(dtype="float32", max_model_len=256, num_kv_blocks=64, block_size=16)
    cpu = [r.outputs[0].token_ids for r in LLM(path, device="cpu", **kw).generate(prompts, params)]
    runs = {}
    for use_chain in (True, False):
        llm, log = mtp_llm(path, use_chain, 3, device="cuda", **kw)
        assert llm.engine.proposer.chain.graphs is not None
        ids = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
        runs[use_chain] = (ids, log)
    (ids, log), (loop_ids, loop_log) = runs[True], runs[False]
    assert ids == loop_ids == cpu
    diff = next((i for i, (a, b) in enumerate(zip(log, loop_log)) if a[0] != b[0]), None)
    assert diff is None, f"draft call {diff}: chain {log[diff][0]} loop {loop_log[diff][0]}"
    assert len(log) == len(loop_log) and all(rows for _, rows in log)


def _tiny_mtp_greedy_case(tmp_path):
    """A tiny hybrid checkpoint with a random MTP layer under ``tmp_path``, four prompts with
    greedy params, the engine keywords and the CPU's plain greedy tokens for them:
    (path, prompts, params, kw, cpu tokens)."""
    import sys
    sys.path.insert(0, "tests")
    from harness_hybrid import random_mtp_weights, tiny_hybrid_hf
    from hybrid_checkpoint import write_checkpoint

    from mtpserve import LLM, SamplingParams

    hf, _ = tiny_hybrid_hf("qwen3_next", mtp_num_hidden_layers=1)
    path = str(write_checkpoint(tmp_path / "tiny", hf, random_mtp_weights(hf)))
    prompts = [[5, 9, 33, 2, 71], list(range(2, 40)), [100, 101, 102] * 5, [7] * 3]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
              for n in (8, 11, 17, 23)]
    kw = dict(max_model_len=256, num_kv_blocks=64, block_size=16)
    cpu = [r.outputs[0].token_ids for r in LLM(path, device="cpu", dtype="float32", **kw)
           .generate(prompts, params)]
    return path, prompts, params, kw, cpu


def test_mtp_drafts_ahead_with_graphs_as_without(tmp_path):
    """Tiny hybrid (float32) on CUDA, captured graphs: drafting ahead (spec/draft_ahead.py:
    acceptance on the device, observe over every verified position, the chain's layout picked
    on the device) proposes, step after step, the drafts of the usual step, and both generate
    the CPU's plain greedy tokens; sampling requests generate the same tokens both ways."""
    import sys
    sys.path.insert(0, "tests")
    from test_draft_ahead import engine

    from mtpserve import SamplingParams

    path, prompts, params, kw, cpu = _tiny_mtp_greedy_case(tmp_path)
    logs = {}
    for ahead in (True, False):
        llm, log, counts = engine(path, ahead, device="cuda", **kw)
        assert llm.engine.proposer.chain.graphs is not None
        assert [r.outputs[0].token_ids for r in llm.generate(prompts, params)] == cpu
        logs[ahead] = log
        assert (counts["used"] > 0) == ahead
    assert logs[True] == logs[False]
    # sampling requests (spec/sampled_ahead.py): the device's speculative sampling emits the
    # host verification's tokens, seeded or from the shared generator
    sampled = [SamplingParams(max_tokens=n, temperature=t, seed=s, top_p=tp, ignore_eos=True)
               for n, t, s, tp in ((9, 0.8, 1, 1.0), (12, 1.0, None, 0.9), (15, 0.6, 3, 1.0),
                                   (6, 0.0, None, 1.0))]
    runs = {}
    for ahead in (True, False):
        llm, log, counts = engine(path, ahead, device="cuda", seed=7, **kw)
        runs[ahead] = ([r.outputs[0].token_ids for r in llm.generate(prompts, sampled)], log)
        assert (counts["ahead"] > 0) == ahead
    assert runs[True] == runs[False]


def test_mtp_plain_steps_overlap_with_graphs_as_sync_steps(tmp_path):
    """Tiny hybrid (float32) on CUDA, captured graphs, async scheduling: the steps the gate
    keeps plain are launched before the previous one is read back, their hidden states kept
    on the device and observed by the MTP in one forward before it drafts (spec/mtp.py
    ``observe_launched``, mtp_backlog.py); the drafts of the other steps are, step after
    step, those of the synchronous engine, and both generate the CPU's greedy tokens."""
    import sys
    sys.path.insert(0, "tests")
    from test_mtp_overlap import engine

    path, prompts, params, kw, cpu = _tiny_mtp_greedy_case(tmp_path)
    logs = {}
    for overlap in (True, False):
        llm, log, counts = engine(overlap, path=path, device="cuda", **kw)
        assert llm.engine.runner.graphs is not None and llm.engine.proposer.chain.graphs
        # random MTP weights accept ~nothing: draft k anyway, priced without the graphs'
        # measured times (they differ between the two engines, and so would the budgets)
        policy = llm.engine.proposer.policy
        policy.prior, policy.prior_weight, policy.decay = 0.99, 1e6, 1.0
        policy.step_cost, policy.cost, policy.draft_cost = None, 0.0, 0.0
        assert [r.outputs[0].token_ids for r in llm.generate(prompts, params)] == cpu
        logs[overlap] = log
        assert counts["observed"] == counts["overlapped"] and (counts["overlapped"] > 5) == overlap
    assert logs[True] == logs[False] and len(logs[True]) >= 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kernels_match_their_torch_references(dtype):
    """Each layer on CUDA (Triton) against the same layer on the CPU (plain PyTorch)."""
    from types import SimpleNamespace

    from mtpserve.layers.activation import SiluAndMul
    from mtpserve.layers.norm import RMSNorm
    from mtpserve.layers.rotary import RotaryEmbedding

    tol = 1e-5 if dtype == torch.float32 else 2e-2
    g = torch.Generator().manual_seed(1)

    def close(a, b):
        return ((a.float().cpu() - b.float()).norm() / b.float().norm()).item() < tol

    x = torch.randn(37, 576, generator=g).to(dtype)
    for zc in (False, True):
        norm = RMSNorm(576, 1e-6, zero_centered=zc)
        norm.weight.data.normal_(0.5, 0.3, generator=g)
        assert close(norm.cuda()(x.cuda()), norm.cpu()(x.float()).to(dtype))
    h = torch.randn(11, 2 * 1536, generator=g).to(dtype)
    assert close(SiluAndMul()(h.cuda()), SiluAndMul()(h.float()).to(dtype))
    cfg = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    for head_dim, rot in ((64, 64), (256, 64)):
        rope = RotaryEmbedding(head_dim, rot, 512, cfg)
        q = torch.randn(13, 6, head_dim, generator=g).to(dtype)
        pos = torch.randint(0, 512, (13,), generator=g)
        ref = rope.apply(q.float(), rope.lookup(pos, torch.float32)).to(dtype)
        rope = rope.cuda()
        assert close(rope.apply(q.cuda(), rope.lookup(pos.cuda(), dtype)), ref)


@pytest.mark.parametrize("tokens, top_k, experts", [(1, 10, 512), (4, 10, 512), (7, 2, 8),
                                                    (64, 8, 64), (300, 4, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_kernel_matches_expert_loop(tokens, top_k, experts, dtype):
    """Grouped Triton expert GEMMs against the per-expert loop of FusedExperts on the CPU, also
    inside a CUDA graph replayed with other routing."""
    from mtpserve.kernels.fused_moe_triton import fused_experts
    from mtpserve.layers.moe import FusedExperts

    g = torch.Generator().manual_seed(tokens * experts)
    hidden, inter = 256, 96
    fe = FusedExperts(experts, hidden, inter)
    fe.gate_up_proj.data.normal_(0, 0.05, generator=g)
    fe.down_proj.data.normal_(0, 0.05, generator=g)

    def routing():
        x = torch.randn(tokens, hidden, generator=g)
        w, ids = torch.softmax(torch.randn(tokens, experts, generator=g), -1).topk(top_k, -1)
        return x, ids, w

    wgu, wd = fe.gate_up_proj.to("cuda", dtype), fe.down_proj.to("cuda", dtype)
    tol = 1e-4 if dtype == torch.float32 else 2e-2

    def check(out, x, ids, w):
        ref = fe(x.to(dtype).float(), ids, w.to(dtype).float())
        rel = ((out.float().cpu() - ref).norm() / ref.norm()).item()
        assert rel < tol, rel

    x, ids, w = routing()
    check(fused_experts(x.to("cuda", dtype), ids.cuda(), w.to("cuda", dtype), wgu, wd), x, ids, w)
    sx, sids, sw = x.to("cuda", dtype), ids.cuda(), w.to("cuda", dtype)
    fused_experts(sx, sids, sw, wgu, wd)            # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(sx, sids, sw, wgu, wd)
    x, ids, w = routing()
    sx.copy_(x.to(dtype)), sids.copy_(ids), sw.copy_(w.to(dtype))
    graph.replay()
    check(out, x, ids, w)


def test_align_by_expert_kernel_matches_torch():
    """The sort by expert in one Triton kernel equal (torch.equal) to its PyTorch reference on
    the edge cases of tests/moe_align_check.py and routed random ids of several sizes (up to
    the kernel's row limit), both block sizes; the dispatch at the row limit; a CUDA-graph
    replay with other ids (the same cases run on the CPU under the interpreter:
    tests/test_moe_align.py)."""
    import sys
    sys.path.insert(0, "tests")
    import moe_align_check

    sizes = ((1, 10, 512), (7, 8, 64), (128, 10, 512), (257, 8, 64), (1000, 10, 512),
             (1638, 10, 512), (2048, 8, 128), (4096, 4, 256))
    print(moe_align_check.check_align("cuda", sizes))
    print(moe_align_check.check_dispatch("cuda"))
    moe_align_check.check_graph()


def _fused_check():
    import sys
    sys.path.insert(0, "tests")
    import fused_kernel_check

    return fused_kernel_check


def test_fused_add_rms_norm_matches_torch():
    """Residual add + RMSNorm in one kernel: the sum bit-equal to PyTorch's add, the norm equal to
    the unfused Triton kernel and within 1e-6 (float32) / 1 ulp (bfloat16) of float32 PyTorch."""
    print(_fused_check().check_fused_add_rms_norm("cuda"))


def test_fused_gated_rms_norm_matches_torch():
    """The Gated DeltaNet output norm (rmsnorm * weight * silu(z)) in one kernel against the
    layer's PyTorch path on the CPU, z strided as the layer passes it."""
    print(_fused_check().check_gated_rms_norm("cuda"))


def test_fused_qk_norm_rope_kv_write_matches_torch():
    """q/k RMSNorm + RoPE + KV-cache write in one kernel against the PyTorch ops, several head
    shapes, partial rotary, with and without q/k norms; unaddressed cache slots unchanged."""
    print(_fused_check().check_qk_norm_rope_kv_write("cuda"))


def test_gated_attention_fused_path_matches_the_unfused_kernels():
    """Qwen3-Next's gated attention on CUDA: q/k norm + partial RoPE + K/V write reading the
    gated queries in place, attention, the output gate in one kernel, against the unfused
    kernels and PyTorch's gate (tests/gated_attention_check.py); the gate kernel alone within
    an ulp."""
    import sys
    sys.path.insert(0, "tests")
    import gated_attention_check

    print(gated_attention_check.check_output_gate("cuda"))
    print(gated_attention_check.check_gated_attention("cuda"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_norm_kernel_equals_embedding_then_norm(dtype):
    """The MTP's normed token embedding in one kernel: the bits of the embedding lookup then
    the RMSNorm kernel, written into the left half of a wider buffer."""
    import torch.nn.functional as F

    from mtpserve.kernels.fused_triton import embed_rms_norm, rms_norm

    g = torch.Generator().manual_seed(0)
    table = torch.randn(1000, 2048, generator=g).to("cuda", dtype)
    w = (torch.randn(2048, generator=g) * 0.2).to("cuda", dtype)
    ids = torch.randint(0, 1000, (5,), generator=g).cuda()
    out = torch.zeros(5, 4096, device="cuda", dtype=dtype)
    embed_rms_norm(ids, table, w, 1e-6, True, out[:, :2048])
    assert torch.equal(out[:, :2048], rms_norm(F.embedding(ids, table), w, 1e-6, True))
    assert not out[:, 2048:].any()
    raw = torch.empty(5, 2048, device="cuda", dtype=dtype)   # a decoder's first residual too
    normed = embed_rms_norm(ids, table, w, 1e-6, True, torch.empty_like(raw), raw_out=raw)
    assert torch.equal(raw, F.embedding(ids, table)) and torch.equal(normed, out[:, :2048])


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_fused_model_forward_matches_cpu(model_type):
    """A tiny model's prefill + decode steps on CUDA (fused kernels, Triton paged attention)
    against the same model on the CPU path (float32)."""
    print(_fused_check().check_model_forward("cuda", model_type))


def test_gated_delta_rule_kernels_match_reference():
    """Triton conv and gated-delta-rule kernels against the PyTorch reference, and a
    GatedDeltaNet layer through both paths (eager and graph plans; tests/gdn_kernel_check.py,
    which also runs on the CPU under TRITON_INTERPRET=1)."""
    import sys
    sys.path.insert(0, "tests")
    from gdn_kernel_check import check_gdn_kernels

    errors = check_gdn_kernels("cuda")
    assert errors["gdn out torch.float32"] < 1e-5 and errors["layer out torch.float32"] < 1e-4


@pytest.mark.parametrize("n, k", [(576, 576), (960, 576), (12288, 2048), (2048, 6144),
                                  (151936, 2048), (1, 2048), (513, 100)])
def test_gemv_matches_cublas_and_is_row_invariant(n, k):
    """The skinny Triton product against a float32 reference, with bias and float32 output; a
    row gives the same bits whatever the number of rows beside it, among the row counts that
    take the same kernel and tiles (kernels/gemv_triton.py's module doc: preloaded tiles or
    streamed units at one row, pipelined tiles from two rows up and where those do not apply)."""
    from mtpserve.kernels.gemv_triton import MAX_ROWS, gemv, stream_config, tile_config

    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    b = torch.randn(n, device="cuda", generator=g).bfloat16()
    x = torch.randn(MAX_ROWS, k, device="cuda", generator=g).bfloat16()
    ref = x.float() @ w.float().t() + b.float()
    outs = {m: gemv(x[:m], w, b, out_dtype=torch.float32) for m in (1, 2, 3, 4, 5, MAX_ROWS)}

    def kernel(m):
        return str(stream_config(m, n, k) or tile_config(n, k, m))

    for m, out in outs.items():
        assert ((out - ref[:m]).norm() / ref[:m].norm()).item() < 1e-5
        same = [m2 for m2 in outs if kernel(m2) == kernel(m)]
        assert all(torch.equal(out[0], outs[m2][0]) for m2 in same), (m, same)
    assert kernel(5) == kernel(MAX_ROWS)   # at least one pair compared
    y = gemv(x[:3], w, b)
    assert y.dtype == torch.bfloat16
    assert ((y.float() - ref[:3]).norm() / ref[:3].norm()).item() < 1e-2
    with pytest.raises(ValueError, match="at most 16 rows"):
        gemv(x.repeat(2, 1), w)


def test_gemv_split_k_on_cuda():
    """tests/gemv_check.py in bfloat16: [40, 300] and [2048, 6144] (a 1.7B down projection) at
    splits 1, 2, 3, 8: within 1e-5 of float32, row-invariant, repeatable bit for bit, counters
    back to zero."""
    import sys
    sys.path.insert(0, "tests")
    import gemv_check

    assert gemv_check.check_split_k("cuda") < 1e-5


@pytest.mark.parametrize("n, k", [(12288, 2048), (24576, 4096)])
def test_swiglu_epilogue_on_cuda_equals_gemv_then_silu_and_mul(n, k):
    """tests/gemv_check.py in bfloat16 at the 1.7B and 8B gate/up shapes (unsplit, the tiles of
    tile_config), 1, 4 and 16 rows: ``gemv(swiglu=True)`` over the interleaved weight bit-equal
    to gemv then silu_and_mul over the checkpoint order, and to gemv then
    ``silu_and_mul(interleaved=True)``; silu_and_mul(interleaved=True) bit-equal to the plain
    kernel on permuted columns; the ValueError cases. Of these two shapes the model takes the
    epilogue at both (``swiglu_fits``, SWIGLU_MIN_K 0)."""
    import sys
    sys.path.insert(0, "tests")
    import gemv_check
    from mtpserve.kernels import gemv_triton

    assert gemv_triton.swiglu_fits(torch.empty(n, k, device="meta"))
    assert gemv_check.check_swiglu("cuda", shapes=((n, k),), rows=(1, 4, 16)) == 3
    assert gemv_check.check_silu_interleaved("cuda") == 4
    assert gemv_check.check_swiglu_errors("cuda") == 3


@pytest.mark.parametrize("model_type, extra", [("llama", {}), ("qwen3", {}),
                                               ("llama", {"mlp_bias": True})],
                         ids=["llama", "qwen3", "llama-mlp-bias"])
def test_interleaved_gate_up_gives_the_same_logits_on_cuda(tmp_path, model_type, extra):
    """A tiny random Llama / Qwen3 (bf16, eager), with SWIGLU_MIN_K lowered so that its small
    gate/up weight qualifies, loads with its rows interleaved
    (LlamaMLP.process_weights_after_loading): prompt logits of 12 tokens (skinny products, the
    SwiGLU epilogue on and off) and of 40 tokens (cuBLAS), and 16 greedy tokens, bit-equal to
    those after the rows are put back in the checkpoint's order. With mlp_bias (the epilogue
    takes no bias) the rows stay in the checkpoint's order."""
    import sys
    sys.path.insert(0, "tests")
    from harness import logits_of_prompt, tiny_hf_model
    from hybrid_checkpoint import write_checkpoint

    from mtpserve import LLM
    from mtpserve.kernels import gemv_triton
    from mtpserve.layers.activation import deinterleave_gate_up

    hf = tiny_hf_model(model_type, hidden_size=256, num_attention_heads=16,
                       num_key_value_heads=4, head_dim=128, intermediate_size=1024, **extra)
    with torch.no_grad():   # transformers initialises biases to zero
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.1)
    prompts = [[5, 9, 33, 2, 71, 8, 13, 21, 34, 55, 89, 144], list(range(2, 42))]

    def outputs():
        return ([logits_of_prompt(llm.engine, p) for p in prompts], _greedy(llm, prompts, 16))

    # the tiny gate/up weight (2048 x 256) is interleaved at load and takes the epilogue too
    saved = gemv_triton.SWIGLU_EPILOGUE, gemv_triton.SWIGLU_MIN_K
    gemv_triton.SWIGLU_MIN_K = 0
    try:
        llm = LLM(str(write_checkpoint(tmp_path / "tiny", hf)), dtype="bfloat16",
                  max_model_len=256, gpu_memory_utilization=0.3, enforce_eager=True,
                  enable_prefix_caching=False)
        mlps = [layer.mlp for layer in llm.engine.runner.model.model.layers]
        if extra.get("mlp_bias"):
            assert not any(mlp.gate_up_interleaved for mlp in mlps)
            return
        assert all(mlp.gate_up_interleaved for mlp in mlps)
        assert gemv_triton.swiglu_fits(mlps[0].gate_up_proj.weight)   # unsplit
        interleaved = outputs()
        gemv_triton.SWIGLU_EPILOGUE = False
        unfused = outputs()
    finally:
        gemv_triton.SWIGLU_EPILOGUE, gemv_triton.SWIGLU_MIN_K = saved
    for mlp in mlps:   # back to (gate rows, up rows); interleaved weights have no bias
        w = mlp.gate_up_proj.weight
        w.data.copy_(deinterleave_gate_up(w.data))
        mlp.gate_up_interleaved = False
    plain = outputs()
    for got in (interleaved, unfused):
        assert all(torch.equal(a, b) for a, b in zip(got[0], plain[0]))
        assert got[1] == plain[1]


def _moe_router_check():
    import sys
    sys.path.insert(0, "tests")
    import moe_router_check

    return moe_router_check


def test_folded_moe_sum_left_to_the_next_norm_gives_the_combine_kernels_bits():
    """A folded block's per-choice outputs summed by the next residual add + norm: the same
    bits as the combine kernel then the norm, float32 and bfloat16."""
    assert _moe_router_check().check_deferred_sum("cuda", (torch.float32, torch.bfloat16)) == 6


def test_moe_combine_kernel_matches_sum_then_addcmul():
    """The MoE block's end in one kernel (sum over choices + gated shared expert) against
    PyTorch's sum and addcmul: bfloat16 within an ulp, float32 within 1e-6."""
    print(_moe_router_check().check_combine("cuda"))


def test_moe_router_kernel_matches_torch_reference():
    """The routing kernel (softmax, top-k, renormalise, shared-gate sigmoid) against PyTorch in
    float32 and bfloat16 logits: exact ids (ties: lowest index), float32 weights within 1e-6,
    bfloat16 weights within one ulp; strided logits, both program layouts, a NaN row, a CUDA
    graph replay (tests/moe_router_check.py, also run on the CPU by tests/test_moe_router.py)."""
    print(_moe_router_check().check_route("cuda", (torch.float32, torch.bfloat16)))


def test_sparse_moe_block_on_cuda_matches_cpu():
    """SparseMoeBlock on CUDA (merged router + shared-gate product, routing kernel, grouped
    expert GEMMs) against its PyTorch path on the CPU: float32 within 1e-5, bfloat16 within 2e-2,
    1 / 5 / 37 tokens, built on CUDA and moved there, a CUDA-graph replay, dtype round trips."""
    print(_moe_router_check().check_block("cuda", (torch.float32, torch.bfloat16)))


def test_compiling_ahead_compiles_without_running_then_runs():
    """kernels/compile_ahead.py: inside the context a launch of a new specialization leaves its
    output untouched and puts one compiled kernel in Triton's cache; after it, the same launch
    runs that kernel (no further compile) and gives silu(g) * u."""
    from mtpserve.kernels import compile_ahead, fused_triton

    kernel = fused_triton._silu_mul_kernel
    x = torch.randn(2, 2 * 777, device="cuda", dtype=torch.bfloat16)   # n = 777: a new BLOCK
    out = torch.zeros(2, 777, device="cuda", dtype=torch.bfloat16)

    def launch():
        kernel[(2, 1)](x, out, x.stride(0), out.stride(0), 777, BLOCK=1024, PDL=False)

    cache = lambda: kernel.device_caches[torch.cuda.current_device()][0]
    before = len(cache()) if torch.cuda.current_device() in kernel.device_caches else 0
    with compile_ahead.compiling_ahead() as ahead:
        assert compile_ahead.dry() is ahead
        launch()
    assert not compile_ahead.dry()
    if not ahead:
        pytest.skip("this Triton has no AsyncCompileMode")
    torch.cuda.synchronize()
    assert torch.count_nonzero(out) == 0
    assert len(cache()) == before + 1
    launch()
    assert len(cache()) == before + 1
    g, u = x[:, :777].float(), x[:, 777:].float()
    torch.testing.assert_close(out.float(), torch.nn.functional.silu(g) * u, rtol=2e-2, atol=2e-2)


def test_deferred_split_k_sum_gives_the_same_bits(tmp_path, monkeypatch):
    """A split o / down product's partials summed by the next norm (gemv_triton.SplitKPartials)
    against the product summing them itself: tests/gemv_check.py's kernel check in bfloat16,
    then a tiny Llama whose o and down products split four ways (K = 2048; TC off, which would
    take its products of 2-8 rows unsplit): prompt logits of 12
    tokens (eager skinny products) bit-equal, and greedy tokens equal through CUDA graphs (no
    prefix caching: a second run would prefill only the uncached tail, through other products)."""
    import sys
    sys.path.insert(0, "tests")
    import gemv_check
    from harness import logits_of_prompt, tiny_hf_model
    from hybrid_checkpoint import write_checkpoint

    from mtpserve import LLM
    from mtpserve.kernels import gemv_triton

    assert gemv_check.check_deferred_sum("cuda") == 3
    monkeypatch.setattr(gemv_triton, "TC", False)   # products of 2-16 rows split in tiles
    hf = tiny_hf_model("llama", hidden_size=256, num_attention_heads=16, num_key_value_heads=4,
                       head_dim=128, intermediate_size=2048)
    assert gemv_triton.tile_config(256, 2048, rows=16)["split_k"] == 4
    llm = LLM(str(write_checkpoint(tmp_path / "tiny", hf)), dtype="bfloat16", max_model_len=256,
              gpu_memory_utilization=0.3, enable_prefix_caching=False)
    prompts = [[5, 9, 33, 2, 71, 8, 13, 21, 34, 55, 89, 144], list(range(2, 40))]

    def outputs(defer: bool):
        with _switched(llm, gemv_triton, "DEFER_SUM", defer):
            return logits_of_prompt(llm.engine, prompts[0]), _greedy(llm, prompts, 24)

    deferred, summed = outputs(True), outputs(False)
    assert torch.equal(deferred[0], summed[0])
    assert deferred[1] == summed[1]


def test_tile_prefetch_gives_the_same_bits(tmp_path, monkeypatch):
    """gemv_triton.TILE_PREFETCH_STEPS (the tiles asking L2 for their weight before the PDL
    wait): products of 1, 4 and 16 rows at four weight shapes (one split four ways; TC off, so
    that 4 and 16 rows take the tiles) bit-equal
    with every step of every program prefetched and with none; each pipelined launch with it on
    built with PREFETCH and its PTX holding ``prefetch.global.L2``, each preloaded one (one row)
    neither; then a tiny Llama's prompt logits (eager) bit-equal and greedy tokens (CUDA graphs)
    equal with the default prefetch and without."""
    import sys
    sys.path.insert(0, "tests")
    from harness import logits_of_prompt, tiny_hf_model
    from hybrid_checkpoint import write_checkpoint

    from mtpserve import LLM
    from mtpserve.kernels import gemv_triton

    torch.manual_seed(0)
    launches, real = [], gemv_triton._gemv_kernel

    class Spy:   # records each launch's PREFETCH and whether its PTX prefetches
        def __getitem__(self, grid):
            def launch(*a, **kw):
                kernel = real[grid](*a, **kw)
                launches.append((kw["PREFETCH"], "prefetch.global.L2" in kernel.asm["ptx"]))
                return kernel
            return launch

    monkeypatch.setattr(gemv_triton, "_gemv_kernel", Spy())
    monkeypatch.setattr(gemv_triton, "TC", False)   # the tiles at 4 and 16 rows
    for n, k in ((960, 576), (3072, 576), (2048, 2048), (576, 1536)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
        for rows in (1, 4, 16):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            monkeypatch.setattr(gemv_triton, "TILE_PREFETCH_STEPS", 0)
            off = gemv_triton.gemv(x, w)
            monkeypatch.setattr(gemv_triton, "TILE_PREFETCH_STEPS", 64)
            monkeypatch.setattr(gemv_triton, "TILE_PREFETCH_PROGRAMS", 10 ** 6)
            before = len(launches)
            on = gemv_triton.gemv(x, w)
            assert torch.equal(on, off), (n, k, rows)
            # none of these shapes streams; a preloaded tile (one row, one wave) never prefetches
            preload = gemv_triton.tile_config(n, k, rows)["preload"]
            assert launches[before:] == [(0, False) if preload else (64, True)], (n, k, rows)
    assert (64, True) in launches and (0, False) in launches
    monkeypatch.undo()

    hf = tiny_hf_model("llama", hidden_size=256, num_attention_heads=16, num_key_value_heads=4,
                       head_dim=128, intermediate_size=2048)
    llm = LLM(str(write_checkpoint(tmp_path / "tiny", hf)), dtype="bfloat16", max_model_len=256,
              gpu_memory_utilization=0.3, enable_prefix_caching=False)
    prompts = [[5, 9, 33, 2, 71, 8, 13, 21, 34, 55, 89, 144], list(range(2, 40))]
    assert gemv_triton.TILE_PREFETCH_STEPS > 0

    def outputs(steps: int):
        with _switched(llm, gemv_triton, "TILE_PREFETCH_STEPS", steps):
            return logits_of_prompt(llm.engine, prompts[0]), _greedy(llm, prompts, 24)

    on, off = outputs(gemv_triton.TILE_PREFETCH_STEPS), outputs(0)
    assert torch.equal(on[0], off[0])
    assert on[1] == off[1]


@contextlib.contextmanager
def _switched(llm, module, attr: str, value):
    """``module.attr = value`` with ``llm``'s CUDA graphs recaptured for it; on leaving, the old
    value and graphs for it back."""
    try:
        with mock.patch.object(module, attr, value):
            llm.engine.runner.capture_cuda_graphs()
            yield
    finally:
        llm.engine.runner.capture_cuda_graphs()


def _tiny_qwen3_llm(tmp_path, **shape):
    """An ``LLM`` (bfloat16, CUDA graphs, no prefix caching) over a random two-layer Qwen3 of 16
    query heads of 128 (defaults: hidden 256, 4 KV heads, intermediate 2048; ``shape``
    overrides), written to ``tmp_path``."""
    from harness import tiny_hf_model
    from hybrid_checkpoint import write_checkpoint

    from mtpserve import LLM

    kw = dict(hidden_size=256, num_attention_heads=16, num_key_value_heads=4, head_dim=128,
              intermediate_size=2048)
    hf = tiny_hf_model("qwen3", **{**kw, **shape})
    return LLM(str(write_checkpoint(tmp_path / "tiny", hf)), dtype="bfloat16", max_model_len=256,
               gpu_memory_utilization=0.3, enable_prefix_caching=False)


def _variants(kernel) -> int:
    """Compiled variants of a Triton kernel on the current device."""
    caches = kernel.device_caches.get(torch.cuda.current_device())
    return len(caches[0]) if caches else 0


def test_gated_delta_rule_kernels_compile_once_for_every_query_length_and_offset():
    """kernels/jit_options.py: the tokens per sequence T (2..16: prefill tails, verify, catch-
    ups) and gate views that start at any offset run one compiled variant of each kernel
    (before: one per T, and one per alignment; 0.3-0.4 s each at use on the H200)."""
    from mtpserve.kernels import gated_delta_rule_triton as gdn

    Bs, Hk, Hv, Dk, Dv, C, K = 3, 2, 4, 32, 32, 64, 4
    dev = dict(device="cuda")
    ssm = torch.zeros(Bs + 1, Hv, Dk, Dv, **dev)
    conv = torch.zeros(Bs + 1, C, K - 1, dtype=torch.bfloat16, **dev)
    slots = torch.arange(Bs, **dev)
    alog, dtb = torch.zeros(Hv, **dev), torch.zeros(Hv, **dev)
    w = torch.randn(C, K, dtype=torch.bfloat16, **dev)
    counts = []
    for T, offset in ((2, 0), (3, 1), (5, 3), (12, 0), (16, 5), (7, 2)):
        last = torch.full((Bs,), T - 1, **dev)
        x = torch.randn(Bs, T, C, dtype=torch.bfloat16, **dev)
        y = gdn.fused_causal_conv1d(x, w, conv, slots, last)
        q = y[..., :Hk * Dk].unflatten(-1, (Hk, Dk))
        v = torch.randn(Bs, T, Hv, Dv, dtype=torch.bfloat16, **dev)
        flat = torch.randn(2 * Bs * T * Hv + offset, dtype=torch.bfloat16, **dev)
        a = flat[offset:offset + Bs * T * Hv].view(Bs, T, Hv)
        b = flat[offset + Bs * T * Hv:].view(Bs, T, Hv)
        gdn.fused_recurrent_gated_delta_rule(q, q, v, a, b, ssm, slots, torch.empty_like(v),
                                             last=last, gate_params=(alog, dtb))
        counts.append((_variants(gdn._conv_kernel), _variants(gdn._recurrent_kernel)))
    assert counts == [counts[0]] * len(counts)


def test_paged_attention_compiles_once_for_every_table_width_and_offset():
    """The partial, pair and merge kernels run one variant each for block tables of any width
    up to 16 partitions (``s_tab``, ``num_parts``, the merge's ``P_PAD``) and table / length
    views at any offset (before: one per divisibility of each by 16 and per power of two of the
    partitions, 0.5-0.7 s at use on the H200 in the MTP's first catch-ups)."""
    from mtpserve.kernels.paged_attention_triton import (_merge_kernel, _partial_kernel,
                                                         paged_attention_triton, pair_kernel)

    Hq, Hkv, D, block = 8, 2, 64, 16
    kc = torch.randn(64 * block, Hkv, D, dtype=torch.bfloat16, device="cuda")
    vc = torch.randn_like(kc)
    counts = []
    for width, offset in ((16, 0), (13, 1), (17, 3), (32, 16), (9, 5)):
        T = 3
        flat = torch.arange(offset + T * width, dtype=torch.int32, device="cuda") % 64
        tables = flat[offset:].view(T, width)
        lens = torch.tensor([0] * offset + [5, 40, width * block], dtype=torch.int32,
                            device="cuda")[offset:]
        q = torch.randn(T, Hq, D, dtype=torch.bfloat16, device="cuda")
        for grid in (1, 2):   # one program per (token, KV head); partitions side by side
            paged_attention_triton(q, kc, vc, tables, torch.arange(T, device="cuda"), lens,
                                   D ** -0.5, block, part_size=4 * block, grid_parts=grid)
        counts.append(tuple(_variants(k) for k in (_partial_kernel, pair_kernel, _merge_kernel)))
    assert counts == [counts[0]] * len(counts) and min(counts[0]) >= 1


def test_fla_varlen_chunk_matches_the_reference():
    """flash-linear-attention's chunk_gated_delta_rule, one varlen call for three sequences
    (kernels/gated_delta_rule_varlen.py, ``MTPSERVE_GDN_PREFILL=fla``), against the reference
    sequence by sequence: outputs and final states, bf16 inputs, GVA (4 value heads per 2 key
    heads), non-zero initial states."""
    pytest.importorskip("fla")
    from mtpserve.kernels import gated_delta_rule_varlen as varlen

    g = torch.Generator(device="cuda").manual_seed(0)
    lengths, hk, hv, dk, dv = [17, 130, 64], 2, 4, 128, 128
    T = sum(lengths)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)
    q, k = r(T, hk, dk).bfloat16(), r(T, hk, dk).bfloat16()
    v = r(T, hv, dv).bfloat16()
    gate = -torch.rand(T, hv, device="cuda", generator=g)
    beta = torch.rand(T, hv, device="cuda", generator=g).bfloat16().float()
    states = r(len(lengths), hv, dk, dv) * 0.1
    ref = varlen.chunk_varlen(q, k, v, gate, beta, states, lengths, name="torch")
    got = varlen.chunk_varlen(q, k, v, gate, beta, states, lengths, name="fla")
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=3e-2, atol=3e-2)


def test_preloaded_product_tiles(tmp_path):
    """gemv_triton.PRELOAD (one-wave products of one row: whole 16-row tiles loaded before the
    PDL wait, multiplied row by row): tests/gemv_check.py's kernel check in bfloat16 at the
    1.7B o and the 135M shapes (1-16 rows); then a tiny Qwen3 whose one-row products take them:
    the logits of a one-token prefill (eager) within 1% of the pipelined products' and the same
    greedy tokens through CUDA graphs (one request: one-row steps; two: pipelined), with
    PRELOAD on and off."""
    import sys
    sys.path.insert(0, "tests")
    import gemv_check
    from harness import logits_of_prompt

    from mtpserve.kernels import gemv_triton

    assert gemv_check.check_preload("cuda") < 1e-5
    llm = _tiny_qwen3_llm(tmp_path)
    prompts = [[5, 9, 33, 2, 71], list(range(2, 40))]
    assert gemv_triton.tile_config(2048, 256, rows=1)["preload"]
    assert not gemv_triton.tile_config(2048, 256, rows=2)["preload"]

    def outputs(on):
        with _switched(llm, gemv_triton, "PRELOAD", on):
            return (logits_of_prompt(llm.engine, [5]), _greedy(llm, prompts[:1], 24),
                    _greedy(llm, prompts, 24))

    pipelined, preloaded = outputs(False), outputs(True)
    rel = ((preloaded[0] - pipelined[0]).norm() / pipelined[0].norm()).item()
    assert 0 < rel < 1e-2, rel   # 0 would mean the preloaded tiles never ran
    assert preloaded[1:] == pipelined[1:]


def test_streamed_one_row_products(tmp_path, monkeypatch):
    """gemv_triton.STREAM (one-row products of more than one wave streamed in one wave,
    kernels/gemv_stream_triton.py): tests/gemv_check.py's check in bfloat16 at the 1.7B q/k/v,
    gate/up and down and the 8B q/k/v shapes; then a tiny Qwen3 with preloaded tiles off, whose
    o and down products (K = 2048) then stream at one row (seen in the batch-1 graph's
    capture): the logits of a one-token prefill (graphed) within 1% of the tiled products',
    and the same greedy tokens through CUDA graphs (one request: one-row steps; two: tiles)."""
    import sys
    sys.path.insert(0, "tests")
    import gemv_check
    from harness import logits_of_prompt

    from mtpserve.kernels import gemv_triton

    assert gemv_check.check_stream("cuda") < 1e-2
    llm = _tiny_qwen3_llm(tmp_path)
    prompts = [[5, 9, 33, 2, 71], list(range(2, 40))]
    calls = []
    streamed_product = gemv_triton.gemv_stream
    monkeypatch.setattr(gemv_triton, "gemv_stream",
                        lambda *a, **kw: calls.append(a[1].shape) or streamed_product(*a, **kw))

    def outputs(on):
        with _switched(llm, gemv_triton, "PRELOAD", False):
            del calls[:]   # only the capture for STREAM on or off below counts
            with _switched(llm, gemv_triton, "STREAM", on):
                # the batch-1 graph's capture ran the o and down products (256 x 2048) streamed
                assert ((256, 2048) in calls) == on, calls
                assert gemv_triton.stream_fits(1, 256, 2048) == on
                return (logits_of_prompt(llm.engine, [5]), _greedy(llm, prompts[:1], 24),
                        _greedy(llm, prompts, 24))

    tiled, streamed = outputs(False), outputs(True)
    rel = ((streamed[0] - tiled[0]).norm() / tiled[0].norm()).item()
    assert rel < 1e-2, rel
    assert streamed[1:] == tiled[1:]


def test_streamed_products_with_fused_inputs(tmp_path, monkeypatch):
    """gemv_triton.FUSED_INPUTS: tests/gemv_check.py's check in bfloat16 (1.7B down with
    SiLU-and-mul, 1.7B q/k/v and 8B gate/up with the residual add + RMSNorm, each of the three
    with a Gated DeltaNet's output norm in front: 8 cases); then a
    two-layer Qwen3 of the 1.7B's widths (hidden 2048, intermediate 6144), whose one-row q/k/v
    and gate/up products take the norm in front (but layer 0's q/k/v: no residual yet) and down
    products SiLU-and-mul: the fused products seen in the batch-1 graph's capture, the logits of
    a one-token prefill within 1% of the unfused ones, and the same greedy tokens through CUDA
    graphs (one request: one-row steps; two: tiles) with FUSED_INPUTS on and off."""
    import sys
    sys.path.insert(0, "tests")
    import gemv_check
    from harness import logits_of_prompt

    from mtpserve.kernels import gemv_triton

    assert gemv_check.check_stream_fused_inputs("cuda") == 8
    # gate/up kept in checkpoint order (no SwiGLU epilogue, which SWIGLU_MIN_K 0 gives it since
    # session 28), so that the down product takes SiLU-and-mul in front
    monkeypatch.setattr(gemv_triton, "SWIGLU_MIN_K", 1 << 30)
    llm = _tiny_qwen3_llm(tmp_path, hidden_size=2048, num_key_value_heads=8,
                          intermediate_size=6144)
    prompts = [[5, 9, 33, 2, 71], list(range(2, 40))]
    fused_shapes = {(4096, 2048), (12288, 2048), (2048, 6144)}
    calls = []
    fused = gemv_triton.gemv_fused_input
    monkeypatch.setattr(gemv_triton, "gemv_fused_input",
                        lambda *a, **kw: calls.append(a[1].shape) or fused(*a, **kw))

    def outputs(on):
        del calls[:]
        with _switched(llm, gemv_triton, "FUSED_INPUTS", on):
            # the batch-1 graph's capture: q/k/v and gate/up with the norm, down with SiLU
            assert (fused_shapes <= set(calls)) == on, calls
            return (logits_of_prompt(llm.engine, [5]), _greedy(llm, prompts[:1], 24),
                    _greedy(llm, prompts, 24))

    unfused, fused_out = outputs(False), outputs(True)
    rel = ((fused_out[0] - unfused[0]).norm() / unfused[0].norm()).item()
    assert rel < 1e-2, rel
    assert fused_out[1:] == unfused[1:]


def test_host_copies_through_pooled_pinned_buffers_read_their_own_values():
    """HostCopy (engine/forward_batch.py) takes its pinned buffer from a pool and gives it back
    once read: copies made one after another, each behind a kernel that writes its tensor,
    read exactly their values, and the pool hands the same buffer out again."""
    from mtpserve.engine import forward_batch
    from mtpserve.engine.forward_batch import HostCopy

    x = torch.zeros(3, 5, dtype=torch.int64, device="cuda")
    seen, buffers = [], set()
    for i in range(20):
        x.fill_(i)
        torch.cuda._sleep(100_000)          # the copy is queued behind pending work
        x.add_(torch.arange(5, device="cuda"))
        copy = HostCopy(x)
        buffers.add(copy._host.data_ptr())
        seen.append(copy.tolist())
    assert seen == [[[i + j for j in range(5)]] * 3 for i in range(20)]
    assert len(buffers) == 1
    assert len(forward_batch._PINNED_POOL[((3, 5), torch.int64)]) >= 1


def test_row_argmax_matches_torch_argmax_on_cuda():
    """kernels/argmax_triton.py's one-launch row argmax: every case of tests/argmax_check.py
    (ties within and across chunks, the max in a row's last value, rows of -inf, bfloat16, an
    id map, an ``out`` tensor) exactly as torch.argmax on CUDA."""
    import argmax_check

    bad = argmax_check.check("cuda")
    assert len(bad) == 19 and all(v == 0 for v in bad.values()), bad


def test_state_commit_kernel_equals_the_host_commits_on_cuda():
    """StateCache.commit_rows on CUDA (kernels/state_commit_triton.py, one copy kernel per
    state kind) leaves conv and SSM pools bit-equal to one host commit per sequence, random
    states of the qwen3-next-3b sizes (bf16 conv, float32 SSM), 3 sequences."""
    from mtpserve.engine.state_cache import LinearAttnShape, StateCache

    shape = LinearAttnShape(conv_dim=8192, kernel=4, num_v_heads=32, head_k_dim=128,
                            head_v_dim=128)
    caches = [StateCache(3, shape, 5, torch.bfloat16, torch.float32, torch.device("cuda"),
                         max_drafts=3, scratch_rows=4) for _ in range(2)]
    for c in caches:
        g = torch.Generator(device="cuda").manual_seed(0)
        for t in (c._conv_scratch, c._ssm_scratch, c._conv, c._ssm):
            t.copy_(torch.randn(t.shape, generator=g, device="cuda").to(t.dtype))
    slots, rows, pos = [4, 0, 2], [1, 4, 0], [3, 0, 2]
    dev = lambda v: torch.tensor(v, device="cuda")  # noqa: E731
    caches[0].commit_rows(dev(slots), dev(rows), dev(pos))
    for s, r, p in zip(slots, rows, pos):
        caches[1].commit(s, r, p)
    assert torch.equal(caches[0]._conv, caches[1]._conv)
    assert torch.equal(caches[0]._ssm, caches[1]._ssm)
    assert torch.equal(caches[0]._ssm[:, 4], caches[0]._ssm_scratch[:, 1, 3])


def test_a_pooled_read_back_buffer_made_in_inference_mode_serves_outside_it():
    """A HostCopy buffer first made under torch.inference_mode goes back to the pool and is
    written again by a copy outside it (an inference tensor would refuse that in-place copy):
    GPU run 2 of session 31 failed two MTP tests so."""
    from mtpserve.engine.forward_batch import HostCopy

    x = torch.arange(7, device="cuda") * 3
    with torch.inference_mode():
        first = HostCopy(x)
        ptr = first._host.data_ptr()
        assert first.tolist() == [3 * i for i in range(7)]
    again = HostCopy(x + 1)
    assert again._host.data_ptr() == ptr and again.tolist() == [3 * i + 1 for i in range(7)]


def test_fp8_draft_head_kernel_matches_its_reference():
    """kernels/fp8_head_triton.py on CUDA, bf16 x (tests/fp8_head_check.py): 1 row through the
    multiply-and-sum, 3 and 16 rows through tl.dot, the default tiles and two others, reductions
    of 2048 and 80 inputs, within 1e-5 of the largest logit of the dequantized float32
    product."""
    import sys
    sys.path.insert(0, "tests")
    import fp8_head_check

    from mtpserve.kernels import fp8_head_triton as fh

    tiles = (fh.ONE_ROW_TILES, fh.ROWS_TILES, (32, 64, 4, 2))
    assert len(fp8_head_check.check_kernel("cuda", tiles=tiles, N=1000, Ks=(2048, 80))) == 18


def test_mtp_with_the_fp8_draft_head_keeps_greedy_output(tmp_path):
    """Tiny hybrid on CUDA with captured graphs, greedy drafts through the FP8 draft head
    (full vocabulary): the CPU's plain greedy tokens (float32), the chain graphs drafting
    through the head; in bfloat16 the same tokens as the same engine without the FP8 head
    (its random MTP layer gets no draft accepted either way, so both verify the same windows
    and round alike; with accepted drafts bf16 outputs may differ at near-ties)."""
    from mtpserve import LLM

    path, prompts, params, kw, cpu = _tiny_mtp_greedy_case(tmp_path)
    spec = dict(speculative_algorithm="nextn", speculative_num_steps=3,
                speculative_adaptive=False)
    llm = LLM(path, device="cuda", dtype="float32", speculative_draft_head_quantization="fp8",
              **spec, **kw)
    assert llm.engine.proposer.chain.graphs is not None
    assert type(llm.engine.proposer.head).__name__ == "Fp8GreedyHead"
    assert [r.outputs[0].token_ids for r in llm.generate(prompts, params)] == cpu
    bf16 = {}
    for quant in (None, "fp8"):
        llm = LLM(path, device="cuda", dtype="bfloat16", speculative_draft_head_quantization=quant,
                  **spec, **kw)
        bf16[quant] = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
        assert llm.engine.spec_metrics.num_draft_tokens > 0
    assert bf16["fp8"] == bf16[None]
