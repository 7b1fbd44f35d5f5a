"""Skinny matrix products on CUDA (Triton): ``y = x W^T`` for a few rows of ``x``.

A decode step at batch 1 (or a verify step of 1 + k tokens) multiplies a handful of rows by every
weight matrix once, so the step is bound by reading the weights from HBM. This kernel streams
``W`` [N, K] in row tiles, each program owning ``BLOCK_N`` output features and reducing over
``K`` in ``BLOCK_K`` chunks with ``tl.dot`` (the rows of ``x`` are padded to 16, which costs no
extra memory traffic). Few outputs over a long reduction (a down projection) leave too few
programs to keep HBM busy, so the reduction is split over ``SPLIT_K`` programs per tile and
summed by the last of them (kernels/arrival.py). Float32 accumulation; one rounding to the output
dtype.

Two variants compute the elementwise op in front of their product in the prologue, saving that
op's launch (at batch 1 each launch costs ~2-3 us even under PDL, BENCHMARKS.md):
:func:`add_rms_norm_gemv` (a pre-norm block's residual add + RMSNorm, then its q/k/v or gate/up
product) and :func:`silu_mul_gemv` (SwiGLU's SiLU-and-mul, then the down product). (A SwiGLU
variant with SiLU-and-mul in the gate/up product's epilogue was slower on the H200, 1.70 / 1.63
against 1.54 ms per 1.7B batch-1 step, and was removed: BENCHMARKS.md, session 16.)
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from mtpserve.kernels import arrival, pdl
from mtpserve.kernels.arrival import arrive_last
from mtpserve.kernels.pdl import pdl_wait

# most rows of x this kernel takes; larger products go to cuBLAS
MAX_ROWS = 16
# off: every product goes to cuBLAS (benchmarks/gpu_decode.py --compare cublas)
ENABLED = True
# the products that read a pre-norm block's residual add + RMSNorm, or a SwiGLU's SiLU-and-mul,
# compute them in their prologue (add_rms_norm_gemv, silu_mul_gemv) instead of after a launch
# of their own (benchmarks/gpu_decode.py --compare unfused_norm unfused_silu_mul)
NORM_PROLOGUE = True
SILU_MUL_PROLOGUE = True
# widest reduction chunk with a prologue: its two input tiles (x and the residual, or the gate
# and up halves) live in float32 registers (a 512-wide chunk of 16 rows spilled at Qwen3-8B)
PROLOGUE_MAX_BLOCK_K = 256


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight^T`` should take :func:`gemv`: CUDA, 16-bit weights, 2-D ``x`` of at
    most MAX_ROWS rows (every weight shape swept beats cuBLAS, see :func:`tile_config`)."""
    return (ENABLED and x.is_cuda and x.dim() == 2 and x.shape[0] <= MAX_ROWS
            and weight.dtype in (torch.bfloat16, torch.float16) and x.dtype == weight.dtype
            and weight.stride(-1) == 1)


@functools.cache
def tile_config(n: int, k: int) -> dict:
    """Tile sizes and split-K factor for an [n, k] weight.

    From the sweep of benchmarks/gpu_gemv.py on the H200 with weights read from HBM
    (BENCHMARKS.md): wide outputs take wider tiles; few outputs over a reduction of 2048 or more
    (an o or down projection) split the reduction four ways (2048x6144: 10.0 us vs cuBLAS's
    own split-K 11.0 us; 2048x2048: 5.9 vs 6.8 unsplit).
    """
    split = 1
    if n >= 65536:
        block_n, block_k = 64, 128
    elif n >= 12288:
        block_n, block_k = (32 if k <= 2048 else 64), 128
    elif n >= 6144 and k >= 4096:
        block_n, block_k = 64, 256
    elif n >= 4096:
        block_n, block_k = 32, 512 if k >= 2048 else 256
    elif n >= 3072:
        block_n, block_k = 32, 128
    elif k >= 2048:
        block_n, block_k, split = 32, 128, 4
    else:
        block_n, block_k = 16, 128 if k <= 576 else 256
    return dict(block_n=block_n, block_k=block_k, num_warps=4, stages=4, split_k=split)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, r_ptr, nw_ptr, s_ptr, M, N, sx,
                 sw, sy, sr, ss, eps, K: tl.constexpr, K_SPLIT: tl.constexpr,
                 SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                 PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                 STAGES: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    pdl_wait(PDL)
    m = tl.arange(0, ROWS)
    nmask, mmask = n < N, m < M
    acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    sq = tl.zeros([ROWS], tl.float32)   # PROLOGUE_NORM: each row's sum of squares
    for k0 in tl.range(0, K_SPLIT, BLOCK_K, num_stages=STAGES):
        k = pid_k * K_SPLIT + k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * sw + k[None, :],
                    mask=nmask[:, None] & kmask[None, :], other=0.0)
        xmask = mmask[:, None] & kmask[None, :]
        if PROLOGUE == 1:
            x, sq = _add_norm_tile(x_ptr, r_ptr, nw_ptr, s_ptr, m, k, xmask, sx, sr, ss, sq,
                                   pid_n == 0, K, HAS_RES, ZERO_CENTERED)
        elif PROLOGUE == 2:
            x = _silu_mul_tile(x_ptr, m, k, xmask, sx, K)
        else:
            x = tl.load(x_ptr + m[:, None] * sx + k[None, :], mask=xmask, other=0.0)
        acc += tl.dot(x.to(w.dtype), tl.trans(w), input_precision=PRECISION)
    if PROLOGUE == 1:   # RMSNorm's scale is per row: applied to the product (no split-K here)
        acc *= tl.rsqrt(sq / K + eps)[:, None]
    out_mask = mmask[:, None] & nmask[None, :]
    if SPLIT_K > 1:   # partials [SPLIT_K, M, N] float32; the last program of this tile sums them
        part = part_ptr + m[:, None] * N + n[None, :]
        tl.store(part + pid_k * M * N, acc, mask=out_mask)
        if arrive_last(count_ptr + pid_n, SPLIT_K):
            acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT_K):
                acc += tl.load(part + s * M * N, mask=out_mask, other=0.0, cache_modifier=".cg")
            _store(acc, b_ptr, y_ptr, m, n, nmask, out_mask, sy, HAS_BIAS)
    else:
        _store(acc, b_ptr, y_ptr, m, n, nmask, out_mask, sy, HAS_BIAS)


@triton.jit
def _add_norm_tile(x_ptr, r_ptr, nw_ptr, s_ptr, m, k, xmask, sx, sr, ss, sq, writes_sum,
                   K: tl.constexpr, HAS_RES: tl.constexpr, ZERO_CENTERED: tl.constexpr):
    """Columns ``k`` of ``s = residual + x`` (rounded to x's dtype, as the unfused add; stored
    by the tile's ``writes_sum`` program when there is a residual), times the norm weight and
    rounded: the product's input before RMSNorm's per-row scale. Returns it and ``sq`` plus
    the sum of squares of these columns of ``s`` per row."""
    s = tl.load(x_ptr + m[:, None] * sx + k[None, :], mask=xmask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + m[:, None] * sr + k[None, :], mask=xmask, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        if writes_sum:
            tl.store(s_ptr + m[:, None] * ss + k[None, :], s, mask=xmask)
    s = s.to(tl.float32)
    nw = tl.load(nw_ptr + k, mask=k < K, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        nw = 1.0 + nw
    return (s * nw[None, :]).to(x_ptr.dtype.element_ty), sq + tl.sum(s * s, axis=1)


@triton.jit
def _silu_mul_tile(x_ptr, m, k, xmask, sx, K: tl.constexpr):
    """Columns ``k`` of ``silu(x[:, :K]) * x[:, K:]`` rounded to x's dtype, as the SiLU-and-mul
    kernel (kernels/fused_triton.py) computes them: the product's input, bit for bit."""
    g = tl.load(x_ptr + m[:, None] * sx + k[None, :], mask=xmask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + m[:, None] * sx + K + k[None, :], mask=xmask, other=0.0).to(tl.float32)
    return (g / (1.0 + tl.exp(-g)) * u).to(x_ptr.dtype.element_ty)


@triton.jit
def _store(acc, b_ptr, y_ptr, m, n, nmask, out_mask, sy, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + m[:, None] * sy + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         block_n: int | None = None, block_k: int = 256, num_warps: int = 4, stages: int = 4,
         split_k: int = 1, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x [M, K] @ weight[N, K]^T (+ bias [N])`` for ``M <= MAX_ROWS``.

    ``x`` and ``weight`` share a float dtype (weight contiguous along K); returns [M, N] in
    ``out_dtype`` (default x's dtype). ``split_k`` > 1 splits the reduction over that
    many programs per output tile, summed in a fixed order by the last (kernels/arrival.py).
    Tile sizes default to :func:`tile_config`; the result of a row does not depend on M. Raises
    ``ValueError`` for more than MAX_ROWS rows, a weight not contiguous along K, or an ``x`` of
    another width.
    """
    cfg = (tile_config(*weight.shape) if block_n is None else
           dict(block_n=block_n, block_k=block_k, num_warps=num_warps, stages=stages,
                split_k=split_k))
    return _launch(_check(x, weight, weight.shape[1]), weight, bias, cfg, out_dtype)


def add_rms_norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                      eps: float, zero_centered: bool, weight: torch.Tensor,
                      bias: torch.Tensor | None = None,
                      tiles: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm block's residual add, RMSNorm and first product in one launch.

    Returns ``(y, s)``: ``s = residual + x`` rounded to x's dtype (``x`` itself when
    ``residual`` is None) and ``y = rms_norm(s) @ weight^T (+ bias)`` [M, N]. RMSNorm (Zhang &
    Sennrich 2019) scales each row by ``1 / sqrt(mean(s^2) + eps)``; that factor is the same
    for the whole row, so it is applied to the product's float32 accumulator, and the product
    reads ``s * w`` (``s * (1 + w)`` when ``zero_centered``) rounded to x's dtype. That is one
    rounding of a different value than the unfused norm's, so ``y`` agrees with
    ``gemv(rms_norm(s), weight)`` to the dtype's precision, not bit for bit.

    Args:
        x, residual: [M, K], M <= MAX_ROWS, of the weight's dtype; norm_weight: [K].
        eps: added to mean(s^2); weight: [N, K] contiguous along K; bias: [N] or None.
        tiles: :func:`tile_config`'s keys to override (benchmarks/gpu_gemv.py).

    Raises:
        ValueError: as :func:`gemv`, or a residual of another shape or dtype than ``x``.
    """
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} does not match x "
                         f"{tuple(x.shape)} {x.dtype}")
    x = _check(x, weight, weight.shape[1])
    cfg = _prologue_tiles(weight, **(tiles or {}), split_k=1)   # the scale needs whole rows
    s = x if residual is None else torch.empty_like(x)
    r = x if residual is None else residual.contiguous()
    y = _launch(x, weight, bias, cfg, prologue=1, r=r, norm_weight=norm_weight, s=s,
                eps=eps, zero_centered=zero_centered, has_res=residual is not None)
    return y, s


def silu_mul_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  tiles: dict | None = None) -> torch.Tensor:
    """``silu(x[:, :K]) * x[:, K:]`` (SwiGLU, Shazeer 2020) then ``@ weight^T (+ bias)`` in one
    launch, for ``x`` [M, 2K] (a gate/up product's output, M <= MAX_ROWS) and ``weight``
    [N, K]; returns [M, N]. The activation is computed and rounded as
    ``fused_triton.silu_and_mul`` does, so the result equals ``gemv(silu_and_mul(x), weight)``
    bit for bit. ``tiles``: :func:`tile_config`'s keys to override. Raises ``ValueError`` as
    :func:`gemv` (``x`` must be 2K wide)."""
    K = weight.shape[1]
    x = _check(x, weight, 2 * K)
    cfg = _prologue_tiles(weight, **(tiles or {}))
    return _launch(x, weight, bias, cfg, prologue=2)


def _prologue_tiles(weight: torch.Tensor, **overrides) -> dict:
    """:func:`tile_config` for ``weight`` with its chunk at most PROLOGUE_MAX_BLOCK_K wide, then
    ``overrides``."""
    cfg = tile_config(*weight.shape)
    cfg = dict(cfg, block_k=min(cfg["block_k"], PROLOGUE_MAX_BLOCK_K))
    cfg.update(overrides)
    return cfg


def _check(x: torch.Tensor, weight: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` with unit stride along its columns, after checking it against ``weight``."""
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows, got {x.shape[0]}")
    if weight.stride(-1) != 1:
        raise ValueError("gemv needs a weight contiguous along its input dimension")
    if x.shape[1] != width:
        raise ValueError(f"gemv: x has {x.shape[1]} columns for a weight of "
                         f"{weight.shape[1]} inputs (expected {width})")
    return x if x.stride(-1) == 1 else x.contiguous()


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: dict,
            out_dtype: torch.dtype | None = None, prologue: int = 0,
            r: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
            s: torch.Tensor | None = None, eps: float = 0.0, zero_centered: bool = False,
            has_res: bool = False) -> torch.Tensor:
    """Launch ``_gemv_kernel`` over ``x`` (checked by :func:`_check`) with the tiles of ``cfg``
    and a prologue (0: none, 1: residual add + RMSNorm, 2: SiLU-and-mul); returns the new
    [M, N] output."""
    M, (N, K) = x.shape[0], weight.shape
    k_split = triton.cdiv(triton.cdiv(K, cfg["split_k"]), cfg["block_k"]) * cfg["block_k"]
    split_k = triton.cdiv(K, k_split)
    n_tiles = triton.cdiv(N, cfg["block_n"])
    if split_k > 1 and n_tiles > arrival.NUM_COUNTERS:
        raise ValueError(f"gemv: {n_tiles} output tiles is more than split-K can count")
    part = (torch.empty(split_k, M, N, device=x.device, dtype=torch.float32) if split_k > 1
            else weight)
    count = arrival.counters(x.device) if split_k > 1 else weight
    y = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    r = r if r is not None else x
    _gemv_kernel[(n_tiles, split_k)](
        x, weight, bias if bias is not None else weight, y, part, count, r,
        norm_weight if norm_weight is not None else weight, s if s is not None else x, M, N,
        x.stride(0), weight.stride(0), y.stride(0), r.stride(0),
        s.stride(0) if s is not None else 0, eps, K=K, K_SPLIT=k_split, SPLIT_K=split_k,
        HAS_BIAS=bias is not None, PRECISION="ieee" if x.dtype == torch.float32 else None,
        PROLOGUE=prologue, HAS_RES=has_res, ZERO_CENTERED=zero_centered,
        BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], ROWS=MAX_ROWS, STAGES=cfg["stages"],
        num_warps=cfg["num_warps"], **pdl.launch(x))
    return y
