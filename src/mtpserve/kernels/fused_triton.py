"""Fused elementwise kernels for CUDA (Triton): RMSNorm (Zhang & Sennrich 2019), an embedding
lookup + RMSNorm, residual add + RMSNorm, SiLU-and-mul, rotary embedding (RoPE; Su et al. 2021), per-head q/k RMSNorm + RoPE +
KV-cache write of an attention block, and the gated RMSNorm of a Gated DeltaNet layer's output.

Each replaces several PyTorch kernels with one, which matters inside a CUDA graph of a small
model where a decode step is mostly many tiny kernels. The plain-PyTorch versions in
``layers/norm.py``, ``layers/activation.py``, ``layers/rotary.py`` and ``Attention.forward`` are
the CPU path and the references these are tested against (tests/fused_kernel_check.py,
tests/test_gpu.py). All arithmetic is float32 with one rounding to the output dtype per op of
the unfused path (a fused kernel rounds wherever the chain of unfused ops it replaces did).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.gemv_stream_triton import gated_weigh
from mtpserve.kernels.gemv_triton import SplitKPartials
from mtpserve.kernels.pdl import pdl_wait

# warps of a residual add + RMSNorm program (one row a program): in a verify forward of a few
# rows this kernel sits between two products, so its latency is the step's. 8 against 4 on the
# H200: the 1.7B 4-token forward 1.479 against 1.497 ms, the 135M's 0.700 against 0.701
# (BENCHMARKS.md, session 26; benchmarks/gpu_decode.py --compare
# mtpserve.kernels.fused_triton:ADD_NORM_WARPS:4)
ADD_NORM_WARPS = 8


@triton.jit
def _rms_scale(x, n, eps):
    """``1 / sqrt(mean(x^2) + eps)`` of one float32 row ``x`` whose padding lanes are 0."""
    return tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)


@triton.jit
def _weigh(x, r, w, ZERO_CENTERED: tl.constexpr):
    """``x * r`` times the norm weight ``w`` (float32): ``w`` itself, or ``1 + w`` when the
    checkpoint stores ``w - 1`` (zero-centred)."""
    return x * r * (1.0 + w) if ZERO_CENTERED else x * r * w


@triton.jit
def _store_normed(x, w_ptr, o_row, cols, mask, n, eps, ZERO_CENTERED: tl.constexpr):
    """RMSNorm of one float32 row ``x`` (padding lanes 0) by the weight at ``w_ptr``, stored at
    ``o_row`` in its dtype."""
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = _weigh(x, _rms_scale(x, n, eps), w, ZERO_CENTERED)
    tl.store(o_row + cols, y.to(o_row.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, o_ptr, sx, so, n, eps, ZERO_CENTERED: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    _store_normed(x, w_ptr, o_ptr + row * so, cols, mask, n, eps, ZERO_CENTERED)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` [..., N] (any float dtype); same shape and dtype.
    ``out``: a 2-D [R, N] destination (R rows of x, any row stride, unit stride along N; e.g.
    one half of a wider buffer), written and returned as it is.

    Raises:
        ValueError: ``out`` of another row count, width or dtype, or not unit stride along N."""
    shape = x.shape
    x2 = _rows(x)
    if out is None:
        dst = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    elif out.dim() != 2 or out.shape != x2.shape or out.stride(1) != 1 or out.dtype != x.dtype:
        raise ValueError(f"out {tuple(out.shape)} stride {out.stride()} {out.dtype}: expected "
                         f"{tuple(x2.shape)} {x.dtype} with unit stride along the last dim")
    else:
        dst = out
    n = shape[-1]
    _rms_norm_kernel[(x2.shape[0],)](x2, weight, dst, x2.stride(0), dst.stride(0), n, eps,
                                     ZERO_CENTERED=zero_centered,
                                     BLOCK=triton.next_power_of_2(n), **pdl.launch(x))
    return dst.view(shape) if out is None else out


@triton.jit
def _embed_rms_norm_kernel(ids_ptr, t_ptr, w_ptr, o_ptr, raw_ptr, st, so, sr, n, eps,
                           ZERO_CENTERED: tl.constexpr, BLOCK: tl.constexpr, RAW: tl.constexpr,
                           PDL: tl.constexpr):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    tok = tl.load(ids_ptr + row).to(tl.int64)
    e = tl.load(t_ptr + tok * st + cols, mask=mask, other=0.0)
    if RAW:   # the embedding itself too (a decoder's first residual)
        tl.store(raw_ptr + row * sr + cols, e, mask=mask)
    _store_normed(e.to(tl.float32), w_ptr, o_ptr + row * so, cols, mask, n, eps, ZERO_CENTERED)


def embed_rms_norm(ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float,
                   zero_centered: bool, out: torch.Tensor,
                   raw_out: torch.Tensor | None = None) -> torch.Tensor:
    """``rms_norm(table[ids])`` in one kernel (the embedding rows read once, by id), written
    into ``out`` and returned: an MTP layer's normed token embedding (models/mtp.py), or with
    ``raw_out`` also ``table[ids]`` itself (a hybrid decoder's input and first residual,
    models/qwen3_next.py).

    Args:
        ids: [T] int64 token ids (inside the table: not checked on the device).
        table: [V, N] embedding rows, unit stride along N; weight: [N] norm weight (``w - 1``
            when ``zero_centered``); eps: added to mean(x^2).
        out, raw_out: [T, N] in the table's dtype, any row stride, unit stride along N.

    Raises:
        ValueError: for operands that do not fit (checked on the host).
    """
    T, n = ids.shape[0], table.shape[1]
    outs = (out,) if raw_out is None else (out, raw_out)
    if ids.dim() != 1 or table.stride(1) != 1 or any(
            o.shape != (T, n) or o.stride(1) != 1 or o.dtype != table.dtype for o in outs):
        raise ValueError(f"ids {tuple(ids.shape)}, table {tuple(table.shape)} stride "
                         f"{table.stride()}, out {tuple(out.shape)} stride {out.stride()} "
                         f"{out.dtype}: expected [T], [V, N] and [T, N] of the table's dtype, "
                         "unit stride along N")
    if T:
        raw = out if raw_out is None else raw_out
        _embed_rms_norm_kernel[(T,)](ids, table, weight, out, raw, table.stride(0),
                                     out.stride(0), raw.stride(0), n, eps,
                                     ZERO_CENTERED=zero_centered,
                                     BLOCK=triton.next_power_of_2(n), RAW=raw_out is not None,
                                     **pdl.launch(table))
    return out


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, o_ptr, so_ptr, sx, sr, so, ss, n, eps, s_part,
                         ZERO_CENTERED: tl.constexpr, BLOCK: tl.constexpr, PARTS: tl.constexpr,
                         PDL: tl.constexpr):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    if PARTS > 0:   # x: a split product's float32 partials, summed as the product would have
        x = tl.zeros([BLOCK], tl.float32)
        for s in tl.static_range(PARTS):
            x += tl.load(x_ptr + s * s_part + row * sx + cols, mask=mask, other=0.0)
        x = x.to(so_ptr.dtype.element_ty).to(tl.float32)
    else:
        x = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    res = tl.load(r_ptr + row * sr + cols, mask=mask, other=0.0).to(tl.float32)
    # the rounded sum is both the new residual and the norm's input, as in the unfused ops
    s = (res + x).to(so_ptr.dtype.element_ty)
    tl.store(so_ptr + row * ss + cols, s, mask=mask)
    _store_normed(s.to(tl.float32), w_ptr, o_ptr + row * so, cols, mask, n, eps, ZERO_CENTERED)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 zero_centered: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm in one kernel: returns ``(rms_norm(s), s)`` with
    ``s = residual + x`` rounded to ``x.dtype``.

    Args:
        x, residual: [..., N], same shape and float dtype (the last dim contiguous or not); or
            ``x`` a split product's ``SplitKPartials`` with ``residual`` [M, N] of its dtype,
            summed here as the product would have (kernels/gemv_triton.py).
        weight: [N] norm weight (``w - 1`` when ``zero_centered``); eps: added to mean(x^2).

    Returns new tensors (the inputs are not modified), both shaped like ``x`` in ``x.dtype``;
    equal to ``residual + x`` followed by :func:`rms_norm` (the sum is computed in float32 and
    rounded once, as PyTorch's add does).

    Raises:
        ValueError: if the shapes or dtypes of ``x`` and ``residual`` differ.
    """
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} and residual {tuple(residual.shape)} "
                         f"{residual.dtype} must match")
    shape, n = x.shape, x.shape[-1]
    if isinstance(x, SplitKPartials):   # [S, M, N] float32: rows of partial s at s * stride(0)
        src, x2, num_parts = x.parts, x.parts[0], x.parts.shape[0]
    else:
        src = x2 = _rows(x)
        num_parts = 0
    r2 = _rows(residual)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    total = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _add_rms_norm_kernel[(x2.shape[0],)](
        src, r2, weight, out, total, x2.stride(0), r2.stride(0), out.stride(0), total.stride(0),
        n, eps, src.stride(0), ZERO_CENTERED=zero_centered, BLOCK=triton.next_power_of_2(n),
        PARTS=num_parts, num_warps=ADD_NORM_WARPS, **pdl.launch(r2))
    return out.view(shape), total.view(shape)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` [..., N] as [R, N] with unit stride along N (a copy only when needed)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


@triton.jit
def _silu_mul_kernel(x_ptr, o_ptr, sx, so, n, BLOCK: tl.constexpr, PDL: tl.constexpr,
                     INTERLEAVED: tl.constexpr = False):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    if INTERLEAVED:   # (g0, u0, g1, u1, ...)
        g_col, u_col = 2 * cols, 2 * cols + 1
    else:             # (g0, g1, ..., u0, u1, ...)
        g_col, u_col = cols, n + cols
    g = tl.load(x_ptr + row * sx + g_col, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * sx + u_col, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(o_ptr + row * so + cols, y.to(o_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """``silu(g) * u`` for ``x`` [T, 2n] (unit stride along the last dim) in any float dtype;
    returns [T, n] in ``x.dtype`` (float32 arithmetic, one rounding). The gates are
    ``x[:, :n]`` and the ups ``x[:, n:]``, or with ``interleaved`` ``x[:, 0::2]`` and
    ``x[:, 1::2]`` (a gate/up product whose weight rows were interleaved, models/llama.py)."""
    T, two_n = x.shape
    n = two_n // 2
    out = torch.empty(T, n, dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul_kernel[(T, triton.cdiv(n, block))](x, out, x.stride(0), out.stride(0), n,
                                                 BLOCK=block, INTERLEAVED=interleaved,
                                                 **pdl.launch(x))
    return out


@triton.jit
def _rotary_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, o_ptr, sx_t, sx_h, so_t, so_h, s_tab,
                   D: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                   REST_PAD: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + t)
    i = tl.arange(0, HALF_PAD)
    m = i < HALF
    xb = x_ptr + t * sx_t + h * sx_h
    ob = o_ptr + t * so_t + h * so_h
    x1 = tl.load(xb + i, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(xb + HALF + i, mask=m, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + pos * s_tab + i, mask=m, other=0.0)
    s = tl.load(sin_ptr + pos * s_tab + HALF + i, mask=m, other=0.0)   # the unsigned half
    tl.store(ob + i, (x1 * c - x2 * s).to(o_ptr.dtype.element_ty), mask=m)
    tl.store(ob + HALF + i, (x2 * c + x1 * s).to(o_ptr.dtype.element_ty), mask=m)
    if REST_PAD > 0:  # channels past the rotary part pass through
        r = 2 * HALF + tl.arange(0, REST_PAD)
        rm = r < D
        tl.store(ob + r, tl.load(xb + r, mask=rm, other=0.0), mask=rm)


def rotary(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
           signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, H, D] (neox layout) by the float32 tables [max_pos, rotary_dim] at
    ``positions`` [T]; ``signed_sin`` has its first half negated (layers/rotary.py)."""
    T, H, D = x.shape
    rot = cos.shape[1]
    out = torch.empty(T, H, D, dtype=x.dtype, device=x.device)
    rest = D - rot
    _rotary_kernel[(T, H)](x, positions, cos, signed_sin, out, x.stride(0), x.stride(1),
                           out.stride(0), out.stride(1), cos.stride(0), D=D, HALF=rot // 2,
                           HALF_PAD=triton.next_power_of_2(rot // 2),
                           REST_PAD=triton.next_power_of_2(rest) if rest else 0,
                           **pdl.launch(x))
    return out


@triton.jit
def _norm_rope_head(src, dst, w_ptr, cos_row, sin_row, eps, D: tl.constexpr,
                    HALF: tl.constexpr, BLOCK_D: tl.constexpr, HAS_NORM: tl.constexpr,
                    ZERO_CENTERED: tl.constexpr):
    """One head: ``src`` [D] -> optional RMSNorm (rounded to src's dtype) -> RoPE on the first
    ``2 * HALF`` channels (float32, one rounding) -> ``dst`` [D] in dst's dtype."""
    d = tl.arange(0, BLOCK_D)
    m = d < D
    rot = d < 2 * HALF
    # each rotated channel's partner in rotate-half: i <-> i + HALF
    pd = tl.where(d < HALF, d + HALF, tl.where(rot, d - HALF, d))
    x = tl.load(src + d, mask=m, other=0.0).to(tl.float32)
    xp = tl.load(src + pd, mask=m, other=0.0).to(tl.float32)
    if HAS_NORM:
        r = _rms_scale(x, D, eps)
        w = tl.load(w_ptr + d, mask=m, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + pd, mask=m, other=0.0).to(tl.float32)
        x = _weigh(x, r, w, ZERO_CENTERED).to(src.dtype.element_ty).to(tl.float32)
        xp = _weigh(xp, r, wp, ZERO_CENTERED).to(src.dtype.element_ty).to(tl.float32)
    c = tl.load(cos_row + d, mask=rot, other=1.0)
    sn = tl.load(sin_row + d, mask=rot, other=0.0)   # first half negated: rotate_half's sign
    y = tl.where(rot, x * c + xp * sn, x)
    # round as the unfused path does (model dtype), then to the destination's (a KV cache's)
    y = y.to(src.dtype.element_ty).to(dst.dtype.element_ty)
    tl.store(dst + d, y, mask=m)


@triton.jit
def _qk_norm_rope_kv_kernel(qkv_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, q_ptr,
                            kc_ptr, vc_ptr, s_qkv, s_qh, k_off, v_off, s_q, s_kc, s_vc, s_tab,
                            eps, HQ: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                            BLOCK_D: tl.constexpr, HAS_NORM: tl.constexpr,
                            ZERO_CENTERED: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)             # 0..HQ-1: query heads; HQ..: key/value heads
    pos = tl.load(pos_ptr + t)
    row = qkv_ptr + t * s_qkv
    cos_row, sin_row = cos_ptr + pos * s_tab, sin_ptr + pos * s_tab
    if h < HQ:
        _norm_rope_head(row + h * s_qh, q_ptr + t * s_q + h * D, qw_ptr, cos_row, sin_row, eps,
                        D, HALF, BLOCK_D, HAS_NORM, ZERO_CENTERED)
    else:
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            kv_head_write(row, k_off, v_off, h - HQ, kc_ptr + slot * s_kc, vc_ptr + slot * s_vc,
                          D, kw_ptr, cos_row, sin_row, eps, D, HALF, BLOCK_D, HAS_NORM,
                          ZERO_CENTERED)


@triton.jit
def kv_head_write(row, k_off, v_off, hk, kc_slot, vc_slot, s_head, kw_ptr, cos_row, sin_row, eps,
                  D: tl.constexpr, HALF: tl.constexpr, BLOCK_D: tl.constexpr,
                  HAS_NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr):
    """KV head ``hk`` of one token's ``row`` of qkv into its cache slot (``kc_slot`` /
    ``vc_slot``: the slot's first element, heads ``s_head`` apart): the key normed and rotated
    (:func:`_norm_rope_head`), the value as it is."""
    _norm_rope_head(row + k_off + hk * D, kc_slot + hk * s_head, kw_ptr, cos_row, sin_row, eps,
                    D, HALF, BLOCK_D, HAS_NORM, ZERO_CENTERED)
    d = tl.arange(0, BLOCK_D)
    v = tl.load(row + v_off + hk * D + d, mask=d < D)
    tl.store(vc_slot + hk * s_head + d, v.to(vc_slot.dtype.element_ty), mask=d < D)


def qk_norm_rope_kv_write(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                          positions: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                          k_cache: torch.Tensor, v_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, q_weight: torch.Tensor | None = None,
                          k_weight: torch.Tensor | None = None, eps: float = 1e-6,
                          zero_centered: bool = False,
                          q_head_stride: int | None = None) -> torch.Tensor:
    """The attention block between the QKV GEMM and attention, in one kernel.

    For each token t: RMSNorm of each query and key head over its ``head_dim`` channels when
    ``q_weight`` / ``k_weight`` are given (Qwen3's q_norm / k_norm; the result rounded to the
    model dtype, as the unfused norm returns it), RoPE (neox / rotate-half layout) on the first
    ``rotary_dim`` channels of the queries and keys at ``positions[t]`` in float32 with one
    rounding, then: rotated queries to the returned tensor, rotated keys and the values to
    ``k_cache[slot_mapping[t]]`` / ``v_cache[slot_mapping[t]]``. Equal to q_norm / k_norm ->
    ``rotary`` -> ``write_kv`` of the unfused CUDA path (up to the order of the float32 sum of
    squares).

    Args:
        qkv: [T, W] model dtype, unit stride along W: query head h at ``h * q_head_stride``
            (default ``head_dim``; Qwen3-Next's gated queries interleave a gate: 2 * head_dim),
            then ``num_kv_heads`` key heads at ``num_heads * q_head_stride``, then as many value
            heads, each ``head_dim`` wide.
        positions: [T] int64 token positions (rows of the tables).
        cos, signed_sin: [max_position, rotary_dim] float32 tables, ``signed_sin`` with its first
            half negated (``RotaryEmbedding``); rotary_dim even and <= head_dim, the channels past
            it pass through.
        k_cache, v_cache: [num_slots, num_kv_heads, head_dim], unit stride along the last two
            dims (per-layer views of the KV cache are); written in place.
        slot_mapping: [T] int64 cache slot of each token; a negative slot skips that token's
            K/V write (this code base pads CUDA graphs with a real spare slot instead).
        q_weight, k_weight: [head_dim] norm weights (both or neither); eps: the norms' epsilon;
            zero_centered: the weights store ``w - 1``.

    Returns:
        q [T, num_heads, head_dim] in qkv's dtype.

    Raises:
        ValueError: for inconsistent shapes or layouts (checked on the host, no device sync).
    """
    T, D = qkv.shape[0], head_dim
    qs = q_head_stride or D
    rot = cos.shape[1]
    _check_qkv_layout(qkv, num_heads * qs + 2 * num_kv_heads * D, rot, D, k_cache, v_cache,
                      num_kv_heads, q_weight, k_weight)
    q = torch.empty(T, num_heads, D, dtype=qkv.dtype, device=qkv.device)
    has_norm = q_weight is not None
    qw = q_weight if has_norm else cos          # unread placeholders without norms
    kw = k_weight if has_norm else cos
    k_off = num_heads * qs
    _qk_norm_rope_kv_kernel[(T, num_heads + num_kv_heads)](
        qkv, positions, slot_mapping, cos, signed_sin, qw, kw, q, k_cache, v_cache,
        qkv.stride(0), qs, k_off, k_off + num_kv_heads * D, q.stride(0), k_cache.stride(0),
        v_cache.stride(0), cos.stride(0), eps, HQ=num_heads, D=D, HALF=rot // 2,
        BLOCK_D=triton.next_power_of_2(D), HAS_NORM=has_norm, ZERO_CENTERED=zero_centered,
        **pdl.launch(qkv))
    return q


def _check_qkv_layout(qkv, width, rot, D, k_cache, v_cache, num_kv_heads, q_weight, k_weight):
    """Raise ValueError unless the operands of :func:`qk_norm_rope_kv_write` fit together."""
    if qkv.dim() != 2 or qkv.shape[1] != width or qkv.stride(1) != 1:
        raise ValueError(f"qkv {tuple(qkv.shape)} stride {qkv.stride()}: expected [T, {width}] "
                         "with unit stride along the last dim")
    if rot % 2 or rot > D:
        raise ValueError(f"rotary_dim {rot} must be even and <= head_dim {D}")
    for c in (k_cache, v_cache):
        if c.dim() != 3 or c.shape[1:] != (num_kv_heads, D) or c.stride()[1:] != (D, 1):
            raise ValueError(f"KV cache {tuple(c.shape)} stride {c.stride()}: expected "
                             f"[slots, {num_kv_heads}, {D}] with unit stride in the last two dims")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("q_weight and k_weight go together (both or neither)")


@triton.jit
def _gated_rms_norm_kernel(x_ptr, z_ptr, w_ptr, o_ptr, sx, sz_t, sz_h, so, heads, n, eps,
                           BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    t, h = row // heads, row % heads
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + t * sz_t + h * sz_h + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dt = o_ptr.dtype.element_ty
    normed = (x * _rms_scale(x, n, eps)).to(dt).to(tl.float32)
    tl.store(o_ptr + row * so + cols, gated_weigh(normed, w, z, dt).to(dt), mask=mask)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """``rmsnorm(x) * weight * silu(z)`` per head, as ``layers.linear_attention.GatedRMSNorm``
    computes it (rounded to x's dtype after the norm, after the weight, at the end).

    Args:
        x: [T, Hv, D] (any float dtype; a copy when its last two dims are not contiguous);
        z: [T, Hv, D], unit stride along D (a strided view of the in_proj output is fine);
        weight: [D] in x's dtype; eps: the norm's epsilon.

    Returns:
        [T, Hv, D] in x's dtype.
    """
    T, heads, n = x.shape
    x2 = _rows(x)
    if z.stride(-1) != 1:
        z = z.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _gated_rms_norm_kernel[(T * heads,)](x2, z, weight, out, x2.stride(0), z.stride(0),
                                         z.stride(1), out.stride(0), heads, n, eps,
                                         BLOCK=triton.next_power_of_2(n), **pdl.launch(x))
    return out.view(T, heads, n)
