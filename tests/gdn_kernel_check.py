"""The Triton Gated DeltaNet kernels (kernels/gated_delta_rule_triton.py) against the PyTorch
reference (kernels/gated_delta_rule.py), on any device: tests/test_gpu.py runs
``check_gdn_kernels("cuda")``; on a machine without a GPU the same checks run on the CPU under the
Triton interpreter::

    TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'tests'); \\
        from gdn_kernel_check import check_gdn_kernels; check_gdn_kernels('cpu')"

Checked: outputs, the slots written in place (others bit-identical), the scratch rows (other rows
and positions bit-identical), padding rows, grouped value heads, float32 and bfloat16 inputs,
strided inputs, the gates computed in the kernel; a GatedDeltaNet layer's forward through the
Triton path against its PyTorch path for eager plans (padding, a prefill chunk beside, scratch
from the host list) and CUDA-graph plans (token mask, scratch row tensor); on the CPU also whole
tiny hybrid models (prefill, decode, verify, a mixed batch) through both paths.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from mtpserve.kernels import gated_delta_rule_triton as gdn
from mtpserve.kernels.gated_delta_rule import (causal_conv1d, conv_states,
                                               recurrent_gated_delta_rule)

F32_TOL = 1e-5


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64."""
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _assert_close(errors: dict, name: str, out, ref, tol: float) -> None:
    e = rel_err(out, ref)
    errors[name] = max(errors.get(name, 0.0), e)
    assert e <= tol, (name, e)


def _lengths(gen, bs: int, T: int) -> list[int]:
    n = torch.randint(1, T + 1, (bs,), generator=gen).tolist()
    n[bs // 2] = T                                # the block is as long as its longest row
    return n


def _scratch_rows(gen, bs: int, num_rows: int) -> torch.Tensor:
    rows = torch.randperm(num_rows, generator=gen)[:bs]
    if bs > 1:
        rows[1] = -1                                # a sequence that verifies nothing
    return rows


def _written(shape_bt, lengths, rows) -> torch.Tensor:
    """[rows, P] bool: the scratch entries the kernels write."""
    mask = torch.zeros(shape_bt, dtype=torch.bool)
    for r, n in zip(rows.tolist(), lengths):
        if r >= 0:
            mask[r, :n] = True
    return mask


def _scratch_checked(pool, pool0, slots, scratch, scratch0, lengths, rows, with_scratch, case):
    """Assert that slots other than ``slots`` and scratch entries the kernel was not meant to
    write are untouched; return [(b, row, n)] for each sequence whose scratch row (``row``,
    first ``n`` positions) the caller compares with its reference."""
    dev = pool.device
    others = torch.ones(pool.shape[0], dtype=torch.bool)
    others[slots.cpu()] = False
    assert torch.equal(pool[others.to(dev)], pool0[others.to(dev)]), case
    written = _written(scratch.shape[:2], lengths, rows.cpu() if with_scratch
                       else torch.full((len(lengths),), -1)).to(dev)
    assert torch.equal(scratch[~written], scratch0[~written]), case
    return [(b, int(rows[b]), n) for b, n in enumerate(lengths)
            if with_scratch and int(rows[b]) >= 0]


# --------------------------------------------------------------------------- gated delta rule

RECURRENT_CASES = [
    # Bs, T, Hk, Hv, Dk, Dv, input dtype, scratch, gates in kernel, out dtype, block_v
    (1, 1, 1, 1, 16, 16, torch.float32, False, False, torch.float32, None),
    (3, 4, 2, 4, 16, 32, torch.float32, True, False, torch.float32, None),
    (2, 3, 2, 4, 8, 12, torch.float32, True, True, torch.float32, None),
    (5, 5, 2, 4, 32, 32, torch.float32, True, True, torch.float32, 8),
    (4, 2, 2, 8, 16, 16, torch.bfloat16, False, False, torch.float32, None),
    (5, 5, 2, 4, 32, 16, torch.bfloat16, True, True, torch.float32, None),
    (3, 3, 1, 2, 16, 16, torch.bfloat16, True, True, torch.bfloat16, None),
    (2, 3, 2, 4, 128, 128, torch.bfloat16, True, True, torch.float32, None),
]


def _qkv(gen, bs, T, hk, hv, dk, dv, dtype, dev):
    """q, k, v as strided views of one [Bs, T, conv_dim + 5] buffer (as the conv output)."""
    kd = hk * dk
    buf = torch.randn(bs, T, 2 * kd + hv * dv + 5, generator=gen).to(dtype).to(dev)
    q = buf[..., :kd].unflatten(-1, (hk, dk))
    k = buf[..., kd:2 * kd].unflatten(-1, (hk, dk))
    v = buf[..., 2 * kd:2 * kd + hv * dv].unflatten(-1, (hv, dv))
    return q, k, v


def _gate_inputs(gen, bs, T, hk, hv, raw, dtype, lengths, dev):
    """(kernel g, kernel beta, gate_params, reference g, reference beta); the reference gates are
    float32 and zero on padding."""
    pad = torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]            # [Bs, T]
    if raw:
        # a, b interleaved per key head (strided views, as the grouped in_proj_ba once gave
        # them): [Bs, T, Hk, 2r] -> views
        r = hv // hk
        ba = (3 * torch.randn(bs, T, hk, 2 * r, generator=gen)).to(dtype)
        ba[0, 0, 0, r] = 30.0                      # softplus above its threshold of 20
        ba[-1, 0, -1, -1] = -40.0                  # softplus underflowing to exp(a)
        a_log = torch.rand(hv, generator=gen).log()
        dt_bias = 1 + 0.3 * torch.randn(hv, generator=gen)
        b, a = ba[..., :r], ba[..., r:]
        beta = torch.sigmoid(b.reshape(bs, T, hv).float())
        g = -a_log.exp() * F.softplus(a.reshape(bs, T, hv).float() + dt_bias)
        ba = ba.to(dev)
        args = (ba[..., r:], ba[..., :r], (a_log.to(dev), dt_bias.to(dev)))
    else:
        g = -2 * torch.rand(bs, T, hv, generator=gen)
        beta = torch.rand(bs, T, hv, generator=gen)
    g, beta = g.masked_fill(pad[..., None], 0.0), beta.masked_fill(pad[..., None], 0.0)
    if not raw:
        args = (g.to(dev), beta.to(dev), None)
    return (*args, g.to(dev), beta.to(dev))


def check_recurrent(dev: str, errors: dict) -> None:
    """fused_recurrent_gated_delta_rule against recurrent_gated_delta_rule (see RECURRENT_CASES)."""
    for case_id, case in enumerate(RECURRENT_CASES):
        bs, T, hk, hv, dk, dv, dtype, with_scratch, raw, out_dtype, block_v = case
        gen = torch.Generator().manual_seed(100 + case_id)
        lengths = _lengths(gen, bs, T)
        q, k, v = _qkv(gen, bs, T, hk, hv, dk, dv, dtype, dev)
        kg, kbeta, params, g, beta = _gate_inputs(gen, bs, T, hk, hv, raw, dtype, lengths, dev)
        pool = torch.randn(bs + 3, hv, dk, dv, generator=gen).to(dev)
        slots = torch.randperm(bs + 3, generator=gen)[:bs].to(dev)
        last = torch.tensor(lengths, device=dev) - 1
        scratch = torch.randn(bs + 2, T + 1, hv, dk, dv, generator=gen).to(dev)
        rows = _scratch_rows(gen, bs, bs + 2).to(dev)
        pool0, scratch0 = pool.clone(), scratch.clone()
        out = torch.full((bs, T, hv, dv), float("nan"), dtype=out_dtype, device=dev)
        gdn.fused_recurrent_gated_delta_rule(
            q, k, v, kg, kbeta, pool, slots, out, last=last,
            scratch=scratch if with_scratch else None, scratch_rows=rows if with_scratch else None,
            gate_params=params, block_v=block_v)
        ref_o, ref_s, states = recurrent_gated_delta_rule(q, k, v, g, beta, pool0[slots],
                                                          keep_states=True)
        tol = F32_TOL if out_dtype == torch.float32 else 1e-2
        _assert_close(errors, f"gdn out {out_dtype}", out, ref_o, tol)
        _assert_close(errors, "gdn slot state", pool[slots], ref_s, F32_TOL)
        for b, r, n in _scratch_checked(pool, pool0, slots, scratch, scratch0, lengths, rows,
                                        with_scratch, case):
            _assert_close(errors, "gdn scratch state", scratch[r, :n], states[b, :n], F32_TOL)


# --------------------------------------------------------------------------- short conv

CONV_CASES = [
    # Bs, T, C, K, dtype, scratch
    (1, 1, 24, 4, torch.float32, False),
    (3, 4, 40, 4, torch.float32, True),
    (2, 3, 16, 2, torch.float32, True),
    (5, 5, 300, 4, torch.bfloat16, True),
    (4, 2, 33, 3, torch.bfloat16, False),
]


def check_conv(dev: str, errors: dict) -> None:
    """fused_causal_conv1d against causal_conv1d + conv_states (see CONV_CASES); the states are
    copies of inputs and must be bit-identical."""
    for case_id, (bs, T, C, K, dtype, with_scratch) in enumerate(CONV_CASES):
        gen = torch.Generator().manual_seed(200 + case_id)
        lengths = _lengths(gen, bs, T)
        x = torch.randn(bs, T, C + 7, generator=gen).to(dtype).to(dev)[..., 3:C + 3]
        weight = (0.5 * torch.randn(C, K, generator=gen)).to(dtype).to(dev)
        pool = torch.randn(bs + 3, C, K - 1, generator=gen).to(dtype).to(dev)
        slots = torch.randperm(bs + 3, generator=gen)[:bs].to(dev)
        last = torch.tensor(lengths, device=dev) - 1
        scratch = torch.randn(bs + 2, T + 1, C, K - 1, generator=gen).to(dtype).to(dev)
        rows = _scratch_rows(gen, bs, bs + 2).to(dev)
        pool0, scratch0 = pool.clone(), scratch.clone()
        y = gdn.fused_causal_conv1d(x, weight, pool, slots, last,
                                    scratch if with_scratch else None,
                                    rows if with_scratch else None)
        ref, window = causal_conv1d(x.float(), pool0[slots].float(), weight.float())
        after = conv_states(window, K).to(dtype)                 # [Bs, T, C, K-1]
        tol = F32_TOL if dtype == torch.float32 else 1e-2
        _assert_close(errors, f"conv out {dtype}", y, ref, tol)
        ar = torch.arange(bs, device=dev)
        assert torch.equal(pool[slots], after[ar, last]), case_id
        for b, r, n in _scratch_checked(pool, pool0, slots, scratch, scratch0, lengths, rows,
                                        with_scratch, case_id):
            assert torch.equal(scratch[r, :n], after[b, :n]), (case_id, b)


# --------------------------------------------------------------------------- one layer


@contextmanager
def triton_path(on: bool):
    """Make GatedDeltaNet take its Triton path (``on``) or its PyTorch path, whatever the device;
    yields a list that counts the layer's path decisions."""
    from mtpserve.layers import linear_attention as la

    before, calls = la.use_triton, []

    def forced(x):
        calls.append(x.device)
        return on

    la.use_triton = forced
    try:
        yield calls
    finally:
        la.use_triton = before


def _layer(model_type: str, dev: str, dtype: torch.dtype):
    """A GatedDeltaNet with random weights (tiny shapes of tests/harness_hybrid.py: Hk 2, Hv 4,
    Dk 8, Dv 12, K 4) and a StateCache of random states for it."""
    from transformers import AutoConfig

    from harness_hybrid import SHAPE
    from mtpserve.config import ModelConfig
    from mtpserve.engine.state_cache import StateCache
    from mtpserve.layers.linear_attention import GatedDeltaNet

    hf = (AutoConfig.for_model("qwen3_next", **SHAPE) if model_type == "qwen3_next"
          else AutoConfig.for_model("qwen3_5", text_config=SHAPE))
    layer = GatedDeltaNet(ModelConfig.from_hf(hf), 0)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name == "A_log":
                p.copy_(torch.rand(p.shape, generator=gen).clamp_min(0.01).log())
            elif name == "dt_bias" or name.startswith("norm"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    layer = layer.to(dev, dtype)
    cache = StateCache(1, layer.state_shape, 6, dtype, torch.float32, torch.device(dev),
                       max_drafts=4, scratch_rows=3)
    for t in cache.conv + cache.ssm + cache.conv_scratch + cache.ssm_scratch:
        t.copy_(torch.randn(t.shape, generator=gen))
    return layer, cache


def _eager_batch(cache, qlens, slots, rows, dev):
    """The fields of a ForwardBatch that ``_plan`` reads (host lists, as the runner makes)."""
    meta = SimpleNamespace(cache=cache, slots_cpu=slots, scratch_rows=rows)
    return SimpleNamespace(extra={"linear_attn": meta}, query_lens_cpu=qlens,
                           input_ids=torch.empty(0, device=dev))


def _graph_batch(cache, qlens, Q, slots, rows, dev):
    """A graph's static batch as engine/hybrid_graph.py fills it: [B, Q] block, token mask."""
    from mtpserve.layers.linear_attention import RecurrentPlan

    i64 = dict(dtype=torch.int64, device=dev)
    mask = torch.zeros(len(qlens) * Q, device=dev)
    for b, q in enumerate(qlens):
        mask[b * Q:b * Q + q] = 1.0
    verify = Q > 1
    plan = RecurrentPlan(
        token_index=None, pad_index=None, num_small=len(qlens), max_q=Q,
        last=torch.tensor([q - 1 for q in qlens], **i64), slots=torch.tensor(slots, **i64),
        scratch=[], large=[], scratch_rows=torch.tensor(rows, **i64) if verify else None,
        token_mask=mask if verify else None)
    meta = SimpleNamespace(cache=cache)
    return SimpleNamespace(extra={"linear_attn": meta, "gdn_plan": plan})


def _clone_cache(cache):
    new = SimpleNamespace()
    for name in ("conv", "ssm", "conv_scratch", "ssm_scratch"):
        setattr(new, name, [t.clone() for t in getattr(cache, name)])
    return new


def _compare_layer(layer, cache, make_batch, T, slots, written, dtype, errors, dev):
    """Run the layer over the same input and states through both paths; compare outputs, the
    states of ``slots`` and the scratch entries ``written`` ([rows, P] bool); the Triton path
    must leave every other slot and scratch entry bit-identical."""
    gen = torch.Generator().manual_seed(T)
    x = torch.randn(T, layer.in_proj.in_features, generator=gen).to(dev, dtype)
    runs = []
    for on in (False, True):
        c = _clone_cache(cache)
        with triton_path(on), torch.inference_mode():
            runs.append((layer(x, make_batch(c)), c))
    (ref, rc), (out, tc) = runs
    # bfloat16: the reference rounds the conv output twice (conv, SiLU), the kernel once
    tol = F32_TOL if dtype == torch.float32 else 2e-2
    _assert_close(errors, f"layer out {dtype}", out, ref, 10 * tol)
    used = torch.zeros(cache.conv[0].shape[0], dtype=torch.bool)
    used[slots] = True
    used = used.to(dev)
    for name in ("conv", "ssm"):
        a, b, a0 = getattr(tc, name)[0], getattr(rc, name)[0], getattr(cache, name)[0]
        _assert_close(errors, f"layer {name} slots {dtype}", a[used], b[used], tol)
        assert torch.equal(a[~used], a0[~used]), name
    w = written.to(dev)
    for name in ("conv_scratch", "ssm_scratch"):
        a, b, a0 = getattr(tc, name)[0], getattr(rc, name)[0], getattr(cache, name)[0]
        _assert_close(errors, f"layer {name} {dtype}", a[w], b[w], tol)
        assert torch.equal(a[~w], a0[~w]), name


def _compare_medium_prefill(layer, cache, dtype, errors, dev, qlens=(2, 150, 40, 300, 129),
                            medium=((1, 40), (2, 150))) -> None:
    """An eager step of prefill chunks in two of the Triton path's padded length buckets (by
    default 33-64 alone and 129-256 with two sequences of unequal lengths, one at the bucket's
    lower edge) beside a decode, and one past MEDIUM_QUERY (the chunked form); ``medium``: the
    (sequences, padded length) of each medium group that ``qlens`` must make."""
    from mtpserve.layers.linear_attention import _plan

    P = cache.ssm_scratch[0].shape[1]
    qlens, slots, rows = list(qlens), [1, 3, 4, 2, 0], [-1] * 5
    with triton_path(True):   # the Triton side of the comparison groups them so
        plan = _plan(_eager_batch(cache, qlens, slots, rows, dev))
    assert [(g.num_small, g.max_q) for g in plan.medium] == list(medium)
    assert [(end - start, slot) for start, end, slot in plan.large] == [(qlens[3], 2)]
    _compare_layer(layer, cache, lambda c: _eager_batch(c, qlens, slots, rows, dev), sum(qlens),
                   slots, torch.zeros(4, P, dtype=torch.bool), dtype, errors, dev)


def check_medium_prefill(dev: str, errors: dict) -> None:
    """Only the medium-prefill step of :func:`check_layer` (Qwen3-Next layout, float32): the
    part of it that runs in CI under the interpreter, there with shorter chunks: the buckets
    17-32 alone and 33-64 with two sequences (40 and 33, the bucket's lower edge), and 257 tokens
    past MEDIUM_QUERY = 256 (its last 64-token chunk partial). The same paths as the default
    lengths (the sequence length is a runtime loop bound of the recurrent kernel, not a
    constexpr), at 352 tokens instead of 621 and padded groups of 20 and 40 tokens instead of 40
    and 150: the interpreter's cost is per token and per padded step (49 s -> ~20 s on a 2-core
    box)."""
    layer, cache = _layer("qwen3_next", dev, torch.float32)
    _compare_medium_prefill(layer, cache, torch.float32, errors, dev, qlens=(2, 40, 20, 257, 33),
                            medium=((1, 20), (2, 40)))


def check_layer(dev: str, errors: dict) -> None:
    """A GatedDeltaNet layer's forward, Triton path against PyTorch path, for both projection
    layouts: an eager step (decode, a padded verify with scratch, a short prefill, a prefill
    chunk > 16 tokens), an eager step of longer prefill chunks (the Triton path's medium
    groups and one past them), a verify graph's block (token mask, scratch row tensor, a sequence with
    fewer real tokens than the block) and a decode graph's block."""
    for model_type in ("qwen3_next", "qwen3_5"):
        for dtype in (torch.float32, torch.bfloat16):
            layer, cache = _layer(model_type, dev, dtype)
            P = cache.ssm_scratch[0].shape[1]
            qlens, slots, rows = [1, 4, 20, 3], [4, 0, 2, 5], [-1, 2, -1, 0]
            _compare_layer(layer, cache, lambda c: _eager_batch(c, qlens, slots, rows, dev),
                           sum(qlens), slots, _written((4, P), qlens, torch.tensor(rows)), dtype,
                           errors, dev)
            _compare_medium_prefill(layer, cache, dtype, errors, dev)
            qlens, slots, rows = [3, 5, 1], [1, 3, 6], [0, 1, 3]
            _compare_layer(layer, cache, lambda c: _graph_batch(c, qlens, 5, slots, rows, dev),
                           15, slots, _written((4, P), qlens, torch.tensor(rows)), dtype, errors,
                           dev)
            _compare_layer(layer, cache, lambda c: _graph_batch(c, [1, 1], 1, [2, 0], [], dev),
                           2, [2, 0], torch.zeros(4, P, dtype=torch.bool), dtype, errors, dev)


def _restore(cache, saved) -> None:
    for name in ("conv", "ssm", "conv_scratch", "ssm_scratch"):
        for t, u in zip(getattr(cache, name), getattr(saved, name)):
            t.copy_(u)


def check_layer_cuda_graph(errors: dict) -> None:
    """CUDA only: a verify block's layer forward captured in a CUDA graph, replayed after the
    step's inputs (x, last, token mask, scratch rows, slots) changed in place as
    engine/hybrid_graph.py changes them, equals the PyTorch path run eagerly on those inputs."""
    layer, cache = _layer("qwen3_next", "cuda", torch.float32)
    saved = _clone_cache(cache)
    Q, H = 4, layer.in_proj.in_features
    batch = _graph_batch(cache, [4, 4, 4], Q, [1, 3, 6], [0, 1, 3], "cuda")
    plan = batch.extra["gdn_plan"]
    x = torch.zeros(3 * Q, H, device="cuda")
    with triton_path(True), torch.inference_mode():
        layer(x, batch)                                   # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(x, batch)
    qlens, slots, rows = [2, 4, 1], [5, 0, 2], [2, 3, 0]
    new = _graph_batch(cache, qlens, Q, slots, rows, "cuda").extra["gdn_plan"]
    for name in ("last", "slots", "scratch_rows", "token_mask"):
        getattr(plan, name).copy_(getattr(new, name))
    x.copy_(torch.randn(3 * Q, H, generator=torch.Generator().manual_seed(3)))
    _restore(cache, saved)
    graph.replay()
    ref_cache = _clone_cache(saved)
    with triton_path(False), torch.inference_mode():
        ref = layer(x, _graph_batch(ref_cache, qlens, Q, slots, rows, "cuda"))
    _assert_close(errors, "layer out in a CUDA graph", out, ref, 10 * F32_TOL)
    for name in ("conv", "ssm"):
        _assert_close(errors, f"layer {name} slots in a CUDA graph", getattr(cache, name)[0][slots],
                      getattr(ref_cache, name)[0][slots], F32_TOL)
    w = _written((4, cache.ssm_scratch[0].shape[1]), qlens, torch.tensor(rows)).cuda()
    for name in ("conv_scratch", "ssm_scratch"):
        _assert_close(errors, f"layer {name} in a CUDA graph", getattr(cache, name)[0][w],
                      getattr(ref_cache, name)[0][w], F32_TOL)


# --------------------------------------------------------------------------- whole models


def check_models_cpu(errors: dict) -> None:
    """Tiny hybrid models (tests/harness_hybrid.py, CPU only) through both paths: a short
    prefill, decodes, a verify with drafts and a mixed batch with a prefill chunk; logits within
    1e-4 and every slot and scratch state within 1e-5 (relative)."""
    from harness_hybrid import HybridHarness, tiny_hybrid_hf

    for model_type, kw in (("qwen3_next", dict(mlp_only_layers=[2])),
                           ("qwen3_5", dict(tie_word_embeddings=True))):
        hf, cfg = tiny_hybrid_hf(model_type, **kw)
        results = []
        for on in (False, True):
            h = HybridHarness(hf, hf_config=cfg, k=3)
            with triton_path(on) as calls:
                results.append(_drive(h))
            assert len(calls) >= 4 * len(h.model.linear_attention_layers())
        (ref_logits, ref_cache), (logits, cache) = results
        assert len(logits) == len(ref_logits) >= 6
        for a, b in zip(logits, ref_logits):
            e = (a - b).abs().max().item()
            errors["model logits (abs)"] = max(errors.get("model logits (abs)", 0.0), e)
            assert e <= 1e-4, (model_type, e)
        for name in ("conv", "ssm", "conv_scratch", "ssm_scratch"):
            for a, b in zip(getattr(cache, name), getattr(ref_cache, name)):
                _assert_close(errors, f"model {name}", a, b, F32_TOL)


def _drive(h) -> tuple[list[torch.Tensor], object]:
    ids = [(7 * i + 3) % 256 for i in range(40)]
    s1, s2, s3 = h.new_seq(ids[:14], "a"), h.new_seq(ids[5:35], "b"), h.new_seq(ids[9:17], "c")
    logits = h.step([(s1, 9), (s3, 5)])[0]                           # padded short prefills
    logits += h.step([(s1, 1), (s3, 1, [4, 5, 6])])[0]               # decode beside a verify
    logits += h.step([(s2, 20), (s1, 1, [8, 9]), (s3, 1)])[0]        # with a prefill chunk
    logits += h.step([(s2, 5), (s1, 1), (s3, 1, [1, 2, 3])])[0]
    return [x.clone() for x in logits if x.numel()], h.runner.state_cache


def check_gdn_kernels(device: str) -> dict:
    """Every check above on ``device`` ("cuda", or "cpu" under TRITON_INTERPRET=1; the CUDA-graph
    check only on CUDA, the whole-model check only on the CPU: on CUDA test_gpu.py's
    test_hybrid_model_on_cuda_matches_cpu covers whole models). Returns the largest error of each
    kind; raises AssertionError."""
    errors: dict = {}
    check_conv(device, errors)
    check_recurrent(device, errors)
    check_layer(device, errors)
    if device == "cuda":
        check_layer_cuda_graph(errors)
    else:
        check_models_cpu(errors)
    for name, e in errors.items():
        print(f"{name}: {e:.2e}")
    return errors
