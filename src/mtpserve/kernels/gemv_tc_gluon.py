"""Skinny products of 2-16 rows streamed through shared memory onto tensor cores (Gluon, CUDA).

``y = x W^T`` for a verify step's few rows of ``x`` [M, K] (M <= 16) by a 16-bit weight
[N, K]. The pipelined tiles of kernels/gemv_triton.py request nothing before their PDL wait
(Triton's software pipeliner issues its first loads after it), and holding a weight step in
registers there spilled (BENCHMARKS.md, session 26); a 4-row product on CUDA cores cannot keep
pace with HBM (sessions 24, 27). Here each program owns ``BLOCK_N`` = 16 x warps output features
over the whole reduction, in units of ``BLOCK_K`` inputs, and keeps a ring of ``STAGES`` units
in shared memory filled by ``cp.async`` (sm_80+ asynchronous copies: no registers held while in
flight). The weight's first ``STAGES`` units are asked for before the PDL wait, while the kernel
before still runs, as the one-row streamed product does with its first unit
(kernels/gemv_stream_triton.py); the rows of x follow after the wait, one chunk per unit. Each
unit is multiplied with ``mma.sync.m16n8k16`` (weight rows as the A operand, ``x^T`` as B, the
rows of x padded to ``XR``, 8 or 16) into ``NACC`` float32 accumulators, one a contiguous half
of the unit (NACC 2), summed in a fixed order at the end: a row's bits do not depend on the rows beside it.

Written in Gluon (``triton.experimental.gluon``, Triton 3.4+), Triton's layout-explicit
language, which exposes shared memory, ``cp.async`` groups and ``mma_v2``; it builds with
Triton 3.6 (the H200's) and 3.9. ``gemv_triton.gemv`` routes products of 2-8 rows here
(``gemv_triton.TC``). On the H200, 4 rows, one product in a chain of 20 on cold weights
(benchmarks/gpu_gemv_tc.py): the 1.7B q/k/v 5.56 us against 6.92 in the tiles, o 3.36 against
5.61, gate/up 12.93 against 14.20, down 9.65 against 9.84; the 135M's 1.6-2.2 us against
2.2-3.6 (BENCHMARKS.md, session 28).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

# cp.async into shared memory: ``async_load`` since Triton 3.7, ``async_copy_global_to_shared``
# before (3.6 on the H200 here)
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
# a CTA barrier: ``barrier`` since Triton 3.7, ``thread_barrier`` before
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _pdl_wait(PDL: gl.constexpr):
    """``griddepcontrol.wait`` then ``launch_dependents`` (kernels/pdl.py's protocol)."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;"
                                  "\n\tmov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)


@gluon.jit
def _copy_rows(ptr, smem, row0, rows_valid, u, K, stride, ROWS: gl.constexpr,
               BLOCK_K: gl.constexpr, STAGES: gl.constexpr, LOAD: gl.constexpr):
    """Start copying unit ``u`` (columns ``u * BLOCK_K`` on) of rows ``row0 .. row0 + ROWS``
    of a row-major matrix (rows from ``rows_valid`` on and columns past K read as zero) into
    ring slot ``u % STAGES``: a program's weight tile, or x's rows."""
    rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, LOAD))
    cols = u * BLOCK_K + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, LOAD))
    ptrs = ptr + rows[:, None].to(gl.int64) * stride + cols[None, :]
    _async_load(smem.index(u % STAGES), ptrs,
                mask=(rows < rows_valid)[:, None] & (cols < K)[None, :])


@gluon.jit
def _unit_mma(w_smem, x_smem, s, acc, j: gl.constexpr, NACC: gl.constexpr,
              BLOCK_K: gl.constexpr, MMA: gl.constexpr):
    """``acc += W[:, slice j] @ x[:, slice j]^T`` for slice ``j`` of NACC of ring slot ``s``."""
    width: gl.constexpr = BLOCK_K // NACC
    a = w_smem.index(s).slice(j * width, width, dim=1).load(gl.DotOperandLayout(0, MMA, 2))
    b = x_smem.index(s).slice(j * width, width, dim=1).permute((1, 0)).load(
        gl.DotOperandLayout(1, MMA, 2))
    return mma_v2(a, b, acc)


@gluon.jit
def _store(acc, y_ptr, tile, M, N, sy, BLOCK_N: gl.constexpr, XR: gl.constexpr,
           MMA: gl.constexpr):
    """y[m, n] = acc[n - tile * BLOCK_N, m] for m < M, n < N, rounded to y's dtype."""
    n = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
    m = gl.arange(0, XR, layout=gl.SliceLayout(0, MMA))
    gl.store(y_ptr + m[None, :] * sy + n[:, None], acc.to(y_ptr.dtype.element_ty),
             mask=(n < N)[:, None] & (m < M)[None, :])


@gluon.jit
def _store_swiglu(acc, y_ptr, tile, M, N, sy, BLOCK_N: gl.constexpr, XR: gl.constexpr,
                  num_warps: gl.constexpr):
    """SiLU-and-mul of interleaved (gate, up) weight rows: ``acc`` [BLOCK_N, XR] float32 ->
    ``y[m, tile * BLOCK_N / 2 + j] = silu(g_j) * u_j``, the products first rounded to y's dtype
    and computed as ``fused_triton._silu_mul_kernel`` does (the bits of the product stored,
    then SiLU-and-mul). Through shared memory: rows 2j and 2j + 1 of the tile are one row of
    its [BLOCK_N / 2, 2 XR] view."""
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    h = gl.allocate_shared_memory(y_ptr.dtype.element_ty, [BLOCK_N, XR], FLAT)
    h.store(acc.to(y_ptr.dtype.element_ty))
    _cta_barrier()
    pairs = h.reshape([BLOCK_N // 2, 2 * XR])
    OUT: gl.constexpr = gl.BlockedLayout([1, 1], [32 // XR, XR], [num_warps, 1], [1, 0])
    g = pairs.slice(0, XR, dim=1).load(OUT).to(gl.float32)
    u = pairs.slice(XR, XR, dim=1).load(OUT).to(gl.float32)
    y = g / (1.0 + gl.exp(-g)) * u
    j = tile * (BLOCK_N // 2) + gl.arange(0, BLOCK_N // 2, layout=gl.SliceLayout(1, OUT))
    m = gl.arange(0, XR, layout=gl.SliceLayout(0, OUT))
    gl.store(y_ptr + m[None, :] * sy + j[:, None], y.to(y_ptr.dtype.element_ty),
             mask=(j < N // 2)[:, None] & (m < M)[None, :])


@gluon.jit
def _tc_kernel(x_ptr, w_ptr, y_ptr, M, N, sx, sw, sy, K: gl.constexpr, BLOCK_K: gl.constexpr,
               STAGES: gl.constexpr, XR: gl.constexpr, NACC: gl.constexpr, SWIGLU: gl.constexpr,
               PDL: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_N: gl.constexpr = 16 * num_warps
    U: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    tile = gl.program_id(0)
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1],
                                                   instr_shape=[16, 8])
    LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    SMEM: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
    w_smem = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [STAGES, BLOCK_N, BLOCK_K], SMEM)
    x_smem = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [STAGES, XR, BLOCK_K], SMEM)
    for first in gl.static_range(STAGES):
        if first < U:
            _copy_rows(w_ptr, w_smem, tile * BLOCK_N, N, first, K, sw, BLOCK_N, BLOCK_K, STAGES,
                       LOAD)
    _pdl_wait(PDL)
    for first in gl.static_range(STAGES):
        if first < U:
            _copy_rows(x_ptr, x_smem, 0, M, first, K, sx, XR, BLOCK_K, STAGES, LOAD)
    async_copy.commit_group()
    acc0 = gl.zeros([BLOCK_N, XR], gl.float32, layout=MMA)
    acc1 = gl.zeros([BLOCK_N, XR], gl.float32, layout=MMA)
    for u in range(U):
        # the first STAGES units are one group; each later unit is its own
        if u == 0:
            async_copy.wait_group(0)
        else:
            async_copy.wait_group(STAGES - 1)
        _cta_barrier()
        s = u % STAGES
        acc0 = _unit_mma(w_smem, x_smem, s, acc0, 0, NACC, BLOCK_K, MMA)
        if NACC == 2:
            acc1 = _unit_mma(w_smem, x_smem, s, acc1, 1, NACC, BLOCK_K, MMA)
        _cta_barrier()
        if u + STAGES < U:
            _copy_rows(w_ptr, w_smem, tile * BLOCK_N, N, u + STAGES, K, sw, BLOCK_N, BLOCK_K,
                       STAGES, LOAD)
            _copy_rows(x_ptr, x_smem, 0, M, u + STAGES, K, sx, XR, BLOCK_K, STAGES, LOAD)
        async_copy.commit_group()
    if NACC == 2:
        acc0 = acc0 + acc1
    if SWIGLU:
        _store_swiglu(acc0, y_ptr, tile, M, N, sy, BLOCK_N, XR, num_warps)
    else:
        _store(acc0, y_ptr, tile, M, N, sy, BLOCK_N, XR, MMA)


def tc_config(n: int, k: int, sms: int) -> dict:
    """``gemv_tc`` keywords for an [n, k] weight on a GPU of ``sms`` SMs: one warp a program
    (16 outputs), units of 512 inputs, 4 in flight where the programs are one a SM, 3 where
    they are two (never more than the reduction has); past two a SM, units of 256, 3 in flight,
    so that every program's ring fits in shared memory at once. A reduction of at most 512 takes
    two units (Triton 3.6 fails to lower the loop over a single unit). The best of a sweep or within 6%
    of it for each 135M / 1.7B weight at 4 rows but the 135M gate/up (2.27 against 2.05 us at
    two warps; benchmarks/gpu_gemv_tc.py, BENCHMARKS.md session 28)."""
    programs = -(-n // 16)
    half = max(32, triton.next_power_of_2(k) // 2)   # at least two units
    if programs > 2 * sms:
        return dict(block_k=min(256, half), stages=3, num_warps=1)
    block_k = min(512, half)
    units = -(-k // block_k)
    return dict(block_k=block_k, stages=max(2, min(4 if programs <= sms else 3, units)),
                num_warps=1)


def gemv_tc(x: torch.Tensor, weight: torch.Tensor, block_k: int = 128, stages: int = 4,
            num_warps: int = 1, nacc: int = 2, swiglu: bool = False,
            pdl: bool = True) -> torch.Tensor:
    """``x [M, K] @ weight [N, K]^T`` -> [M, N] in x's dtype, for 1 <= M <= 16 rows on CUDA
    (sm_80+ with ``pdl=False``; the default ``pdl=True`` needs sm_90+), ``x`` and ``weight`` of one 16-bit dtype, both contiguous along K
    with aligned rows (:func:`tc_takes`). Programs of ``num_warps`` warps own 16 x num_warps output
    features each; ``block_k`` (a power of two, >= 16 x nacc) inputs a unit, ``stages`` (>= 2) units in
    flight, ``nacc`` (1 or 2) accumulator chains, at least two units (K > block_k); inputs past
    K in the last unit read as zero.
    ``swiglu``: ``weight`` [2I, K] has its gate and up rows interleaved (gemv_triton's SwiGLU
    epilogue); returns ``silu(g) * u`` [M, I], bit-equal to this product then
    ``fused_triton.silu_and_mul(y, interleaved=True)``. Raises ``ValueError`` for what it does
    not take (:func:`tc_takes`)."""
    M, K = x.shape
    N = weight.shape[0]
    if (not tc_takes(x, weight) or nacc not in (1, 2) or block_k & (block_k - 1)
            or block_k % (16 * nacc) or stages < 2 or K <= block_k or (swiglu and N % 2)):
        raise ValueError(f"gemv_tc: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} "
                         f"{weight.dtype}, block_k {block_k}, nacc {nacc}, swiglu {swiglu}")
    y = torch.empty(M, N // 2 if swiglu else N, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(N, 16 * num_warps),)
    _tc_kernel[grid](x, weight, y, M, N, x.stride(0), weight.stride(0), y.stride(0), K=K,
                     BLOCK_K=block_k, STAGES=stages, XR=8 if M <= 8 else 16, NACC=nacc,
                     SWIGLU=swiglu, PDL=pdl, num_warps=num_warps, launch_pdl=pdl)
    return y


def tc_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`gemv_tc` takes ``x`` [M, K] by ``weight`` [N, K]: CUDA, 1-16 rows, one
    16-bit dtype, both contiguous along K, K a multiple of 8 and at least 64, bases 16-byte aligned and row
    strides multiples of 16 elements (Triton knows an integer's divisibility by 16 only, and
    ``cp.async`` copies 16 bytes)."""
    return (x.is_cuda and x.dim() == 2 and 1 <= x.shape[0] <= 16
            and weight.dim() == 2 and weight.shape[1] == x.shape[1] and x.shape[1] % 8 == 0
            and x.shape[1] >= 64
            and x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16)
            and x.stride(1) == 1 and weight.stride(1) == 1
            and x.stride(0) % 16 == 0 and weight.stride(0) % 16 == 0
            and x.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0)
