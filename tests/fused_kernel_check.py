"""Checks of the fused Triton kernels (kernels/fused_triton.py) against PyTorch references, for
any device: ``"cuda"`` (tests/test_gpu.py), or ``"cpu"`` under Triton's interpreter::

    TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'tests'); \\
        import fused_kernel_check as f; f.check_fused_add_rms_norm('cpu'); \\
        f.check_qk_norm_rope_kv_write('cpu'); f.check_model_forward('cpu')"

Each check raises AssertionError on a mismatch and returns the worst errors it measured (for
reports). References compute in float32 with the roundings of the unfused CUDA path: the residual
sum rounded to the dtype, a norm's output rounded to the dtype, RoPE rounded once.

Tolerances: bit-exact for the residual sum, for the K/V slots nobody addressed, and for add + norm
against PyTorch's add followed by the unfused Triton RMSNorm kernel (same layout and reduction).
Against the float32 references, the normalised outputs may differ by the order of the float32 sum
of squares (and the GPU's approximate rsqrt and FMA contraction), a bfloat16 rounding then
flipping by one ulp at most: float32 within 1e-6 of the largest magnitude; bfloat16 add + norm
within one ulp of each value; bfloat16 after RoPE (where a flipped normed input and a flipped
output add up) within 2^-5 of the largest magnitude, at most 1% of the values differing. Under
Triton's interpreter (CPU, with CUDA's bfloat16 rounding, ``interpreter_rounding``) bfloat16 comes
out exact and float32 within 2.2e-7; tests/test_gpu.py prints the figures measured on CUDA.
"""

from __future__ import annotations

import contextlib
import importlib
from types import SimpleNamespace

from unittest import mock

import torch

DTYPES = (torch.float32, torch.bfloat16)
F32_REL = 1e-6        # float32: of the largest magnitude
BF16_REL = 2.0 ** -5  # bfloat16 after RoPE: of the largest magnitude (a few one-ulp flips) ...
BF16_DIFFER = 0.01    # ... in at most this fraction of the values


# ---- error measures ----------------------------------------------------------------------------
def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place between same-dtype float tensors (float32 or
    bfloat16; +0 and -0 are equal)."""
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
    bits = torch.finfo(a.dtype).bits

    def ordered(x):
        i = x.detach().contiguous().view(ints).long()
        mag = i & ((1 << (bits - 1)) - 1)
        return torch.where(i < 0, -mag, mag)

    return int((ordered(a.cpu()) - ordered(b.cpu())).abs().max()) if a.numel() else 0


def rel_to_max(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b| / max |b|`` in float64."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- fused residual add + RMSNorm ----------------------------------------------------------------
def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 zero_centered: bool) -> torch.Tensor:
    """RMSNorm of the Triton kernels' arithmetic in PyTorch: float32, one rounding to x's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.float()
    return (h * (1.0 + w) if zero_centered else h * w).to(x.dtype)


def check_fused_add_rms_norm(device) -> dict:
    """``fused_triton.add_rms_norm`` against ``residual + x`` then the norm, for hidden 576 / 2048,
    1 / 7 / 33 rows, both weight conventions, float32 and bfloat16; also ``RMSNorm.forward(x,
    residual)`` on ``device`` against the same layer's CPU path (float32)."""
    from mtpserve.kernels import fused_triton

    worst = {}
    with interpreter_rounding(device):
        _check_add_rms_norm_cases(device, fused_triton, worst)
    worst.update(_check_rms_norm_layer(device))
    return worst


def _check_add_rms_norm_cases(device, fused_triton, worst) -> None:
    for dtype in DTYPES:
        for hidden in (576, 2048):
            for rows, zc in ((1, False), (7, True), (33, False)):
                g = _gen(hidden + rows)
                x = (torch.randn(rows, hidden, generator=g) * 3).to(dtype).to(device)
                res = (torch.randn(rows, hidden, generator=g) * 20).to(dtype).to(device)
                w = (torch.randn(hidden, generator=g) * 0.3 + (0.0 if zc else 1.0)).to(device)
                out, total = fused_triton.add_rms_norm(x, res, w, 1e-6, zc)
                s = res + x
                assert torch.equal(total, s), "residual sum differs from PyTorch's add"
                ref = rms_norm_ref(s, w, 1e-6, zc)
                unfused = fused_triton.rms_norm(s, w, 1e-6, zc)
                _record(worst, dtype, "add_rms_norm", out, ref)
                _record(worst, dtype, "add_rms_norm_vs_unfused_triton", out, unfused)
                _assert_close(out, ref, dtype, per_value=True)
                # same layout and reduction as the unfused kernel (checked in sm_90 TTGIR) at
                # its 4 warps; the default ADD_NORM_WARPS (8 since session 26) sums in another
                # order, so its float32 bits may differ (its error is checked just above)
                with mock.patch.object(fused_triton, "ADD_NORM_WARPS", 4):
                    same, _ = fused_triton.add_rms_norm(x, res, w, 1e-6, zc)
                assert torch.equal(same, unfused), "differs from add, then the rms_norm kernel"


def _check_rms_norm_layer(device) -> dict:
    """The layer's residual form on ``device`` against its CPU path (float32, both conventions,
    a 3-d input)."""
    from mtpserve.layers.norm import RMSNorm

    worst = {}
    g = _gen(3)
    for zc in (False, True):
        norm = RMSNorm(576, 1e-6, zero_centered=zc)
        norm.weight.data.normal_(0.0 if zc else 1.0, 0.3, generator=g)
        x, res = torch.randn(2, 5, 576, generator=g), torch.randn(2, 5, 576, generator=g)
        ref_out, ref_sum = norm(x, res)
        with triton_on_cpu(device):
            out, s = norm.to(device)(x.to(device), res.to(device))
        norm.cpu()
        assert torch.equal(s.cpu(), ref_sum)
        _assert_close(out, ref_out, torch.float32)
        _record(worst, torch.float32, "RMSNorm(x, residual)_vs_cpu", out, ref_out)
    return worst


# ---- gated RMSNorm of a Gated DeltaNet layer's output --------------------------------------------
def check_gated_rms_norm(device) -> dict:
    """``fused_triton.gated_rms_norm``, through the ``GatedRMSNorm`` layer, against the layer's
    CPU path: z a strided view of a wider projection (as the layer passes it), head dims 128 and
    80 (not a power of two), float32 and bfloat16 (three roundings: after the norm, after the
    weight, at the end; a one-ulp flip in the first two can move the result by a few ulps)."""
    from mtpserve.layers import linear_attention
    from mtpserve.layers.linear_attention import GatedRMSNorm

    worst = {}
    g = _gen(5)
    for dtype in DTYPES:
        for T, heads, D in ((1, 32, 128), (7, 4, 80)):
            norm = GatedRMSNorm(D, 1e-6)
            norm.weight.data.normal_(1.0, 0.3, generator=g)
            norm = norm.to(dtype)
            x = torch.randn(T, heads, D, generator=g).to(dtype)
            proj = torch.randn(T, 2 * heads * D + 3, generator=g).to(dtype)
            ref = norm(x, proj[:, 3:3 + heads * D].view(T, heads, D))
            dev_proj = proj.to(device)
            z = dev_proj[:, 3:3 + heads * D].view(T, heads, D)
            assert T == 1 or z.stride(0) == 2 * heads * D + 3
            saved = linear_attention.use_triton
            linear_attention.use_triton = lambda t: True
            try:
                with interpreter_rounding(device):
                    out = norm.to(device)(x.to(device), z)
            finally:
                linear_attention.use_triton = saved
                norm.cpu()
            _assert_close(out, ref, dtype, per_value=False)
            _record(worst, dtype, "gated_rms_norm_vs_cpu", out, ref)
    return worst


# ---- fused q/k RMSNorm + RoPE + KV-cache write ---------------------------------------------------
QK_SHAPES = [  # (Hq, Hkv, head_dim, rotary_dim, q/k norm, zero-centred norm)
    (9, 3, 64, 64, True, False), (9, 3, 64, 64, False, False),
    (16, 8, 128, 128, True, False), (16, 8, 128, 128, False, False),
    (16, 8, 256, 64, True, True), (9, 3, 256, 64, False, False),
    (4, 4, 80, 80, True, False),   # head_dim not a power of two
]


def rope_tables(rotary_dim: int, max_pos: int = 512):
    """(cos, signed_sin) float32 [max_pos, rotary_dim] as ``RotaryEmbedding`` builds them."""
    from mtpserve.layers.rotary import RotaryEmbedding

    cfg = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    rope = RotaryEmbedding(rotary_dim, rotary_dim, max_pos, cfg)
    return rope.cos, rope.signed_sin


def rope_ref(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
             signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE (neox) of x [T, H, D] in float32 from the float32 tables, one rounding to x's dtype;
    the channels past rotary_dim pass through."""
    r = cos.shape[1]
    h = x.float()
    c, s = cos[positions].unsqueeze(1), signed_sin[positions].unsqueeze(1)
    rot = h[..., :r] * c + h[..., :r].roll(r // 2, dims=-1) * s
    return torch.cat([rot, h[..., r:]], dim=-1).to(x.dtype)


def check_qk_norm_rope_kv_write(device) -> dict:
    """``fused_triton.qk_norm_rope_kv_write`` against per-head RMSNorm -> RoPE -> ``write_kv`` in
    PyTorch for the shapes of ``QK_SHAPES`` in float32 and bfloat16. A token with slot -1 writes
    nothing; cache slots not in ``slot_mapping`` keep their bytes."""
    worst = {}
    with interpreter_rounding(device):
        for dtype in DTYPES:
            for shape in QK_SHAPES:
                _check_qk_case(device, dtype, *shape, worst)
    return worst


def _check_qk_case(device, dtype, hq, hkv, d, rot, norm, zc, worst) -> None:
    from mtpserve.kernels import fused_triton

    g = _gen(hq * d + rot)
    T, slots, eps = 6, 40, 1e-6
    qkv = (torch.randn(T, (hq + 2 * hkv) * d, generator=g) * 2).to(dtype)
    pos = torch.randint(0, 512, (T,), generator=g)
    slot = torch.randperm(slots, generator=g)[:T]
    slot[2] = -1                                   # skipped write
    kc0 = torch.randn(slots, hkv, d, generator=g).to(dtype)
    vc0 = torch.randn(slots, hkv, d, generator=g).to(dtype)
    qw = kw = None
    if norm:
        qw = torch.randn(d, generator=g) * 0.3 + (0.0 if zc else 1.0)
        kw = torch.randn(d, generator=g) * 0.3 + (0.0 if zc else 1.0)
    cos, ssin = rope_tables(rot)
    q_ref, kc_ref, vc_ref = _qk_reference(qkv, hq, hkv, d, pos, cos, ssin, kc0, vc0, slot, qw, kw,
                                          eps, zc)
    dev = lambda t: None if t is None else t.to(device)   # noqa: E731
    kc, vc = kc0.to(device), vc0.to(device)
    q = fused_triton.qk_norm_rope_kv_write(dev(qkv), hq, hkv, d, dev(pos), dev(cos), dev(ssin),
                                           kc, vc, dev(slot), q_weight=dev(qw), k_weight=dev(kw),
                                           eps=eps, zero_centered=zc)
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[slot[slot >= 0]] = False
    assert torch.equal(kc.cpu()[untouched], kc0[untouched]), "an unaddressed K slot changed"
    assert torch.equal(vc.cpu()[untouched], vc0[untouched]), "an unaddressed V slot changed"
    assert torch.equal(vc.cpu(), vc_ref), "V cache differs (a plain copy)"
    written = slot[slot >= 0]
    tag = "_norm" if norm else ""
    q_un, k_un = _qk_unfused_triton(dev(qkv), hq, hkv, d, dev(pos), dev(cos), dev(ssin), dev(qw),
                                    dev(kw), eps, zc)
    k_un = k_un.cpu()[slot >= 0]
    for name, a, b in (("q", q, q_ref), ("k", kc.cpu()[written], kc_ref[written]),
                       ("q_vs_unfused_triton", q, q_un.cpu()),
                       ("k_vs_unfused_triton", kc.cpu()[written], k_un)):
        _record(worst, dtype, f"qk{tag}_rope_{name}", a, b)
        _assert_close(a, b, dtype, per_value=False)


def _qk_unfused_triton(qkv, hq, hkv, d, pos, cos, ssin, qw, kw, eps, zc):
    """The unfused CUDA path: Triton RMSNorm of q and k, then the Triton rotary kernel."""
    from mtpserve.kernels import fused_triton

    T = qkv.shape[0]
    qk = qkv[:, : (hq + hkv) * d].view(T, hq + hkv, d)
    if qw is not None:
        qk = torch.cat([fused_triton.rms_norm(qk[:, :hq], qw, eps, zc),
                        fused_triton.rms_norm(qk[:, hq:], kw, eps, zc)], dim=1)
    qk = fused_triton.rotary(qk, pos, cos, ssin)
    return qk[:, :hq], qk[:, hq:]


def _qk_reference(qkv, hq, hkv, d, pos, cos, ssin, kc, vc, slot, qw, kw, eps, zc):
    """PyTorch reference on the CPU: returns (q [T, Hq, D], K cache, V cache) after the step."""
    from mtpserve.kernels.paged_attention import write_kv

    T = qkv.shape[0]
    q = qkv[:, : hq * d].view(T, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].view(T, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(T, hkv, d)
    if qw is not None:
        q, k = rms_norm_ref(q, qw, eps, zc), rms_norm_ref(k, kw, eps, zc)
    q, k = rope_ref(q, pos, cos, ssin), rope_ref(k, pos, cos, ssin)
    kc, vc = kc.clone(), vc.clone()
    keep = slot >= 0
    write_kv(kc, vc, k[keep], v[keep], slot[keep])
    return q, kc, vc


# ---- shared helpers ------------------------------------------------------------------------------
def _record(worst: dict, dtype, name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    key = f"{name}[{str(dtype).split('.')[-1]}]"
    a, b = a.cpu(), b.cpu()
    prev = worst.get(key, {"rel_to_max": 0.0, "max_ulps": 0, "differ": 0.0})
    worst[key] = {"rel_to_max": max(prev["rel_to_max"], rel_to_max(a, b)),
                  "max_ulps": max(prev["max_ulps"], ulp_distance(a, b)),
                  "differ": max(prev["differ"], (a != b).float().mean().item())}


def _assert_close(a: torch.Tensor, b: torch.Tensor, dtype, per_value: bool = True) -> None:
    """float32: within F32_REL of max|b|; bfloat16: within one ulp of each value (per_value), or
    within BF16_REL of max|b| with at most BF16_DIFFER of the values differing."""
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype == dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    if dtype == torch.float32:
        assert rel_to_max(a, b) <= F32_REL, rel_to_max(a, b)
    elif per_value:
        assert ulp_distance(a, b) <= 1, ulp_distance(a, b)
    else:
        differ = (a != b).float().mean().item()
        assert rel_to_max(a, b) <= BF16_REL and differ <= BF16_DIFFER, (rel_to_max(a, b), differ)


@contextlib.contextmanager
def interpreter_rounding(device):
    """On a CPU ``device`` (Triton's interpreter), round float32 -> bfloat16 casts to nearest
    even as CUDA does: triton 3.6's interpreter truncates them (``_convert_float`` without a
    rounding mode), which would make every bfloat16 result differ from PyTorch by up to an ulp.
    Other conversions keep the interpreter's own code. On CUDA, nothing to do."""
    if torch.device(device).type != "cpu":
        yield
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            t = torch.from_numpy(np.ascontiguousarray(data).view(np.float32))
            return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        return original(data, src, dst, rounding_mode)

    interpreter._convert_float = convert
    try:
        yield
    finally:
        interpreter._convert_float = original


@contextlib.contextmanager
def triton_on_cpu(device, attention: bool = True, hybrid: bool = False):
    """On a CPU ``device`` (under TRITON_INTERPRET=1), make the layers take their Triton paths:
    every mtpserve module's ``use_triton`` answers True (``attention=False`` leaves
    layers/attention.py on its PyTorch path; ``hybrid`` adds the hybrid layers and the MTP
    module). On CUDA, nothing to do."""
    if torch.device(device).type != "cpu":
        yield
        return
    names = ["mtpserve.layers.norm", "mtpserve.layers.rotary", "mtpserve.layers.activation",
             "mtpserve.models.llama"] + (["mtpserve.layers.attention"] if attention else [])
    if hybrid:
        names += ["mtpserve.layers.gated_attention", "mtpserve.layers.linear_attention",
                  "mtpserve.layers.moe", "mtpserve.models.mtp", "mtpserve.models.qwen3_next"]
    mods = [importlib.import_module(n) for n in names]
    saved = [m.use_triton for m in mods]
    for m in mods:
        m.use_triton = lambda x: True
    try:
        yield
    finally:
        for m, f in zip(mods, saved):
            m.use_triton = f


# ---- a whole model -------------------------------------------------------------------------------
def check_model_forward(device, model_type: str = "qwen3", attention: bool = True) -> dict:
    """A tiny random Llama-family model (2 layers; ``qwen3`` has q/k norms) in float32: a 9-token
    prefill and 3 decode steps on ``device`` through the fused kernels, against the same model on
    the CPU path. Decode steps use the per-token attention layout (``paged_attention_triton`` on
    CUDA, or on the CPU with ``attention=True``). Returns the worst logit and KV differences."""
    from harness import tiny_hf_model

    from mtpserve.config import ModelConfig
    from mtpserve.models.llama import LlamaForCausalLM

    hf = tiny_hf_model(model_type)   # hidden 64, 4 / 2 heads of 16, 2 layers
    cfg = ModelConfig.from_hf(hf.config)
    model = LlamaForCausalLM(cfg, 64).eval()
    model.load_weights(hf.state_dict().items())
    ids = torch.randint(0, cfg.vocab_size, (12,), generator=_gen(4))
    with torch.inference_mode():
        ref_logits, ref_kv = _run_steps(model, ids, "cpu", cfg)
        with triton_on_cpu(device, attention):
            logits, kv = _run_steps(model.to(device), ids, device, cfg)
        model.cpu()
    err = {"logits_abs": float((logits.cpu() - ref_logits).abs().max()),
           "kv_abs": max(float((a.cpu() - b).abs().max()) for a, b in zip(kv, ref_kv))}
    assert err["logits_abs"] <= 1e-4 and err["kv_abs"] <= 1e-5, err
    return err


def _run_steps(model, ids, device, cfg, block_size: int = 4, prefill: int = 9):
    """Prefill ``ids[:prefill]`` then decode the rest one token a step over a fresh KV cache
    (identity block table: slot = position). Returns (logits [len(ids), vocab], caches)."""
    from mtpserve.engine.forward_batch import ForwardBatch
    from mtpserve.kernels.paged_attention import TritonAttentionMetadata, build_torch_metadata

    n = len(ids)
    blocks = -(-n // block_size) + 1
    kv = [(torch.zeros(blocks * block_size, cfg.num_key_value_heads, cfg.head_dim, device=device),
           torch.zeros(blocks * block_size, cfg.num_key_value_heads, cfg.head_dim, device=device))
          for _ in range(cfg.num_hidden_layers)]
    tables = torch.arange(blocks, dtype=torch.int32, device=device).unsqueeze(0)
    out = []
    for start, stop in [(0, prefill)] + [(p, p + 1) for p in range(prefill, n)]:
        pos = torch.arange(start, stop, device=device)
        q = stop - start
        batch = ForwardBatch(
            input_ids=ids[start:stop].to(device), positions=pos, slot_mapping=pos.clone(),
            query_start_loc=torch.tensor([0, q], dtype=torch.int32, device=device),
            query_lens=torch.tensor([q], device=device),
            seq_lens=torch.tensor([stop], device=device), block_tables=tables,
            logits_indices=torch.arange(q, device=device), query_lens_cpu=[q],
            seq_lens_cpu=[stop])
        batch.kv_caches = kv
        if q == 1:
            batch.attn = TritonAttentionMetadata(
                torch.zeros(1, dtype=torch.int32, device=device),
                torch.tensor([stop], dtype=torch.int32, device=device), tables, block_size, 64)
        else:
            batch.attn = build_torch_metadata([q], [stop], tables, block_size, torch.device(device))
        out.append(model.compute_logits(model(batch)))
    return torch.cat(out), [t for pair in kv for t in pair]
