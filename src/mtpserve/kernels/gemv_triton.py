"""Skinny matrix products on CUDA (Triton): ``y = x W^T`` for a few rows of ``x``.

A decode step at batch 1 (or a verify step of 1 + k tokens) multiplies a handful of rows by every
weight matrix once, so the step is bound by reading the weights from HBM. This kernel streams
``W`` [N, K] in row tiles, each program owning ``BLOCK_N`` output features and reducing over
``K`` in ``BLOCK_K`` chunks with ``tl.dot`` (the rows of ``x`` are padded to 16, which costs no
extra memory traffic). Float32 accumulation; one rounding to the output dtype.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# most rows of x this kernel takes; larger products go to cuBLAS
MAX_ROWS = 16
# off: every product goes to cuBLAS (benchmarks/gpu_decode.py --no-gemv compares the two)
ENABLED = True


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight^T`` should take :func:`gemv`: CUDA, 16-bit weights, 2-D ``x`` of at
    most MAX_ROWS rows, and a weight shape where it beats cuBLAS (see :func:`tile_config`)."""
    return (ENABLED and x.is_cuda and x.dim() == 2 and x.shape[0] <= MAX_ROWS
            and weight.dtype in (torch.bfloat16, torch.float16) and x.dtype == weight.dtype
            and weight.stride(-1) == 1
            and tile_config(*weight.shape) is not None)


@functools.cache
def tile_config(n: int, k: int) -> dict | None:
    """Tile sizes for an [n, k] weight, or None where cuBLAS is faster.

    From the sweep of benchmarks/gpu_gemv.py on the H200 (BENCHMARKS.md): wide outputs take wider
    tiles; long reductions over few outputs (n <= 2048, k >= 4096, e.g. a down projection) need
    the split-K that cuBLAS does and this kernel does not.
    """
    if n <= 2048 and k >= 4096:
        return None
    if n >= 65536:
        block_n, block_k = 64, 128
    elif n >= 12288:
        block_n, block_k = (32 if k <= 2048 else 64), 128
    elif n >= 4096:
        block_n, block_k = 32, 512 if k >= 2048 else 256
    elif n >= 3072:
        block_n, block_k = 32, 128
    else:
        block_n, block_k = 16, 128 if k <= 576 else 256
    return dict(block_n=block_n, block_k=block_k, num_warps=4, stages=4)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, sx, sw, sy, K: tl.constexpr,
                 HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                 STAGES: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, ROWS)
    nmask, mmask = n < N, m < M
    acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * sw + k[None, :],
                    mask=nmask[:, None] & kmask[None, :], other=0.0)
        x = tl.load(x_ptr + m[:, None] * sx + k[None, :], mask=mmask[:, None] & kmask[None, :],
                    other=0.0)
        acc += tl.dot(x.to(w.dtype), tl.trans(w), input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + m[:, None] * sy + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         block_n: int | None = None, block_k: int = 256, num_warps: int = 4, stages: int = 4,
         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x [M, K] @ weight[N, K]^T (+ bias [N])`` for ``M <= MAX_ROWS``.

    ``x`` and ``weight`` share a float dtype (weight contiguous along K); returns [M, N] in
    ``out_dtype`` (default x's dtype). Tile sizes default to :func:`tile_config`. Raises
    ``ValueError`` for more than MAX_ROWS rows or a weight not contiguous along K.
    """
    M, K = x.shape
    N = weight.shape[0]
    if block_n is None:
        cfg = tile_config(N, K) or dict(block_n=16, block_k=256, num_warps=4, stages=4)
        block_n, block_k, num_warps, stages = (cfg["block_n"], cfg["block_k"], cfg["num_warps"],
                                               cfg["stages"])
    if M > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows, got {M}")
    if weight.stride(-1) != 1:
        raise ValueError("gemv needs a weight contiguous along its input dimension")
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, weight, bias if bias is not None else weight, y, M, N, x.stride(0),
        weight.stride(0), y.stride(0), K=K, HAS_BIAS=bias is not None,
        PRECISION="ieee" if x.dtype == torch.float32 else None, BLOCK_N=block_n,
        BLOCK_K=block_k, ROWS=MAX_ROWS, STAGES=stages, num_warps=num_warps)
    return y
