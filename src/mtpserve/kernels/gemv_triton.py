"""Skinny matrix products on CUDA (Triton): ``y = x W^T`` for a few rows of ``x``.

A decode step at batch 1 (or a verify step of 1 + k tokens) multiplies a handful of rows by every
weight matrix once, so the step is bound by reading the weights from HBM. This kernel streams
``W`` [N, K] in row tiles, each program owning ``BLOCK_N`` output features and reducing over
``K`` in ``BLOCK_K`` chunks with ``tl.dot`` (the rows of ``x`` are padded to 16, which costs no
extra memory traffic). Few outputs over a long reduction (a down projection) leave too few
programs to keep HBM busy, so the reduction is split over ``SPLIT_K`` programs per tile and
summed by the last of them (kernels/arrival.py). Float32 accumulation; one rounding to the output
dtype. :func:`gemv_silu_mul` is the gate/up product of a SwiGLU MLP with the activation in its
epilogue, one launch where a product and ``silu_and_mul`` took two (off by default:
``SILU_MUL_FUSION``).
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
# off: every product goes to cuBLAS (benchmarks/gpu_decode.py --no-gemv compares the two)
ENABLED = True
# SwiGLU MLPs: None, the product then silu_and_mul; "half" / "full", gemv_silu_mul with half /
# all of gemv's block_n rows from each half. None by default: "half" made Qwen3-1.7B's batch-1
# step slower on the H200, 1.712 against 1.539 ms (BENCHMARKS.md, session 15); "full" is not
# measured yet. gpu_decode.py --compare silu_mul_fusion silu_mul_fusion_full
SILU_MUL_FUSION: str | None = None


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
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, M, N, sx, sw, sy,
                 K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr,
                 HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                 STAGES: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    pdl_wait(PDL)
    m = tl.arange(0, ROWS)
    nmask, mmask = n < N, m < M
    acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    for k0 in tl.range(0, K_SPLIT, BLOCK_K, num_stages=STAGES):
        k = pid_k * K_SPLIT + k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * sw + k[None, :],
                    mask=nmask[:, None] & kmask[None, :], other=0.0)
        x = tl.load(x_ptr + m[:, None] * sx + k[None, :], mask=mmask[:, None] & kmask[None, :],
                    other=0.0)
        acc += tl.dot(x.to(w.dtype), tl.trans(w), input_precision=PRECISION)
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
    M = x.shape[0]
    N, K = weight.shape
    if block_n is None:
        cfg = tile_config(N, K)
        block_n, block_k, num_warps, stages, split_k = (
            cfg["block_n"], cfg["block_k"], cfg["num_warps"], cfg["stages"], cfg["split_k"])
    if M > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows, got {M}")
    if weight.stride(-1) != 1:
        raise ValueError("gemv needs a weight contiguous along its input dimension")
    if x.shape[1] != K:
        raise ValueError(f"gemv: x has {x.shape[1]} columns for a weight of {K} inputs")
    if x.stride(-1) != 1:
        x = x.contiguous()
    k_split = triton.cdiv(triton.cdiv(K, split_k), block_k) * block_k
    split_k = triton.cdiv(K, k_split)
    n_tiles = triton.cdiv(N, block_n)
    if split_k > 1 and n_tiles > arrival.NUM_COUNTERS:
        raise ValueError(f"gemv: {n_tiles} output tiles is more than split-K can count")
    part = (torch.empty(split_k, M, N, device=x.device, dtype=torch.float32) if split_k > 1
            else weight)
    count = arrival.counters(x.device) if split_k > 1 else weight
    y = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    _gemv_kernel[(n_tiles, split_k)](
        x, weight, bias if bias is not None else weight, y, part, count, M, N, x.stride(0),
        weight.stride(0), y.stride(0), K=K, K_SPLIT=k_split, SPLIT_K=split_k,
        HAS_BIAS=bias is not None, PRECISION="ieee" if x.dtype == torch.float32 else None,
        BLOCK_N=block_n, BLOCK_K=block_k, ROWS=MAX_ROWS, STAGES=stages, num_warps=num_warps,
        **pdl.launch(x))
    return y


@triton.jit
def _gemv_silu_mul_kernel(x_ptr, w_ptr, y_ptr, M, I, sx, sw, sy, K: tl.constexpr,
                          PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                          STAGES: tl.constexpr, PDL: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    pdl_wait(PDL)
    m = tl.arange(0, ROWS)
    nmask, mmask = n < I, m < M
    gate_rows = w_ptr + n[:, None].to(tl.int64) * sw
    up_rows = w_ptr + (n + I)[:, None].to(tl.int64) * sw
    acc_g = tl.zeros([ROWS, BLOCK_N], tl.float32)
    acc_u = tl.zeros([ROWS, BLOCK_N], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        wmask = nmask[:, None] & kmask[None, :]
        wg = tl.load(gate_rows + k[None, :], mask=wmask, other=0.0)
        wu = tl.load(up_rows + k[None, :], mask=wmask, other=0.0)
        x = tl.load(x_ptr + m[:, None] * sx + k[None, :], mask=mmask[:, None] & kmask[None, :],
                    other=0.0).to(wg.dtype)
        acc_g += tl.dot(x, tl.trans(wg), input_precision=PRECISION)
        acc_u += tl.dot(x, tl.trans(wu), input_precision=PRECISION)
    # rounded as the separate product would store them, then silu_and_mul's float32 formula
    g = acc_g.to(y_ptr.dtype.element_ty).to(tl.float32)
    u = acc_u.to(y_ptr.dtype.element_ty).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(y_ptr + m[:, None] * sy + n[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


def fusable_silu_mul(weight: torch.Tensor) -> bool:
    """Whether :func:`gemv_silu_mul` over this [2I, K] weight gives the bits of
    ``silu_and_mul(gemv(x, weight))``: where :func:`gemv` does not split the reduction (it does
    for 2I < 3072 and K >= 2048, e.g. Qwen3-Next's shared expert, [1024, 2048]: its partial
    sums then add in another order)."""
    return tile_config(*weight.shape)["split_k"] == 1


def gemv_silu_mul(x: torch.Tensor, weight: torch.Tensor, tiles: str = "half") -> torch.Tensor:
    """SwiGLU's first half in one launch: ``silu(x Wg^T) * (x Wu^T)`` for ``weight`` [2I, K]
    (the I gate rows, then the I up rows: ``MergedColumnParallelLinear``'s layout) and ``x``
    [M, K], ``M <= MAX_ROWS``, both bfloat16 or float16 (``use_gemv``). Returns [M, I] in x's
    dtype, bit-equal to ``silu_and_mul(gemv(x, weight))`` where :func:`fusable_silu_mul` (else
    within float32 rounding of it): the epilogue rounds the gate and up products to x's dtype
    before the activation, as the two-kernel path stores them. The
    tiles of :func:`gemv` over [2I, K], a program taking ``tiles`` "half" (the same bytes per
    program as gemv) or "full" (twice them) of gemv's ``block_n`` rows from each half (no
    split-K: these products are wide). Raises ``ValueError`` as :func:`gemv` does, for an odd
    number of weight rows, or for other ``tiles``."""
    M, (N, K) = x.shape[0], weight.shape
    if M > MAX_ROWS or weight.stride(-1) != 1 or x.shape[1] != K or N % 2:
        raise ValueError(f"gemv_silu_mul: x {tuple(x.shape)} (at most {MAX_ROWS} rows) and a "
                         f"weight {tuple(weight.shape)} contiguous along K with 2I rows")
    if tiles not in ("half", "full"):
        raise ValueError(f"gemv_silu_mul: tiles must be 'half' or 'full', got {tiles!r}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    cfg = tile_config(N, K)
    block_n = max(16, cfg["block_n"] // 2) if tiles == "half" else cfg["block_n"]
    inter = N // 2
    y = torch.empty(M, inter, dtype=x.dtype, device=x.device)
    _gemv_silu_mul_kernel[(triton.cdiv(inter, block_n),)](
        x, weight, y, M, inter, x.stride(0), weight.stride(0), y.stride(0), K=K,
        PRECISION="ieee" if x.dtype == torch.float32 else None, BLOCK_N=block_n,
        BLOCK_K=cfg["block_k"], ROWS=MAX_ROWS, STAGES=cfg["stages"], num_warps=cfg["num_warps"],
        **pdl.launch(x))
    return y
