"""Streamed products of 2 to 4 rows on CUDA (Triton): ``y = x W^T`` for the rows of a verify step
(1 + k tokens of one sequence at batch 1) in one wave, with each row's sum kept per lane.

kernels/gemv_stream_triton.py streams one row: each unit [BLOCK_N, BLOCK_K] of the weight is
multiplied by x and summed over its BLOCK_K inputs across all the program's threads (a shuffle
tree and a shared-memory step a unit). Streaming 4 rows that way (session 24, commit a974e81) did
four such sums a unit, one a row, and was 1.4-2x slower than the tiles of kernels/gemv_triton.py:
its compiled loop held ~450 instructions and 8-16 barriers a warp for 16 KB of weight, of which
only 128 were the multiply-adds.

Here a unit is laid out [REPS, BLOCK_N, 32, 8] (input ``k = rep * 256 + lane * 8 + v``): the
warps split the unit's BLOCK_N rows, each lane holds 8 consecutive inputs (one 16-byte load) of
each of REPS stretches of 256, so summing over ``rep`` and ``v`` stays inside a thread. Each row
of x keeps a [BLOCK_N, 32] float32 sum per lane across the units of a row block, and only at the
row block's end are the 32 lanes summed (warp shuffles, no shared memory). Per unit a thread does
4 multiply-adds per weight it holds and a handful of loads; the rows of x are reloaded per chunk
from L1 (at most 4 x K x 2 bytes).

The program structure is the one-row stream's: one wave of ``G`` programs, program ``p`` owning
row blocks ``p, p + G, ...`` and going through their units in order with a register double
buffer, the first unit loaded before the PDL wait (kernels/pdl.py). A row's bits do not depend
on the rows beside it or on M (each row's sum is its own, in a fixed order); they differ from the
one-row stream's and the tiles' (other orders of the sum), as those differ from each other.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.gemv_stream_triton import sm_count, to_f32
from mtpserve.kernels.pdl import pdl_wait

# most rows a launch takes (one float32 sum per row and lane in registers)
MAX_ROWS = 4
# inputs of one stretch: 32 lanes x 8 (one 16-byte load of bfloat16 each)
STRETCH = 256
# on: each lane's 8 products of a stretch summed as one chain of multiply-adds (_lane_sums)
CHAIN = True


@triton.jit
def _unit_offsets(RPW: tl.constexpr, WARPS: tl.constexpr, BLOCK_K: tl.constexpr):
    """A unit's row offsets [1, RPW, WARPS, 1, 1] (row ``j * WARPS + warp``) and input offsets
    [REPS, 1, 1, 32, 8] (input ``rep * 256 + lane * 8 + v``)."""
    REPS: tl.constexpr = BLOCK_K // 256
    rep = tl.arange(0, REPS)[:, None, None, None, None]
    lane = tl.arange(0, 32)[None, None, None, :, None]
    v = tl.arange(0, 8)[None, None, None, None, :]
    j = tl.arange(0, RPW)[None, :, None, None, None]
    wi = tl.arange(0, WARPS)[None, None, :, None, None]
    return j * WARPS + wi, rep * 256 + lane * 8 + v


@triton.jit
def _load_unit(w_ptr, sw, N, u, pid, G, r, kk, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """Unit ``u`` of program ``pid`` [REPS, RPW, WARPS, 32, 8] in the weight's dtype (rows past
    N read as zero): rows of block ``pid + (u // CHUNKS) * G``, inputs of chunk ``u % CHUNKS``."""
    rows = (pid + (u // CHUNKS) * G) * BLOCK_N + r
    return tl.load(w_ptr + rows.to(tl.int64) * sw + ((u % CHUNKS) * BLOCK_K + kk),
                   mask=rows < N, other=0.0)


@triton.jit
def _x_row(x_ptr, sx, i: tl.constexpr, M, chunk, kk, WARPS: tl.constexpr,
           BLOCK_K: tl.constexpr):
    """Chunk ``chunk`` of row ``i`` of x (zero past M) in x's dtype [REPS, 1, WARPS, 32, 8]: one
    copy a warp, so that it takes the unit's layout (loaded as [REPS, 1, 1, 32, 8], Triton laid
    it out otherwise and converted every unit to it through shared memory)."""
    wi = tl.arange(0, WARPS)[None, None, :, None, None]
    return tl.load(x_ptr + i * sx + chunk * BLOCK_K + kk + wi * 0, mask=wi * 0 + i < M,
                   other=0.0)


@triton.jit
def _pairs(t):
    """[R, P, W, 32, n] (n even) -> its elements ``2m`` and ``2m + 1`` of the last axis, two
    [R, P, W, 32, n / 2] (n > 2) or [R, P, W, 32] (n == 2)."""
    if t.shape[4] == 2:
        return tl.split(t)
    else:
        return tl.split(tl.reshape(t, (t.shape[0], t.shape[1], t.shape[2], 32, t.shape[4] // 2,
                                       2)))


@triton.jit
def _eighths(t):
    """The 8 inputs of each lane's stretch, [R, P, W, 32, 8] -> eight [R, P, W, 32]."""
    a, b = _pairs(t)
    a0, a1 = _pairs(a)
    b0, b1 = _pairs(b)
    t0, t4 = _pairs(a0)
    t2, t6 = _pairs(a1)
    t1, t5 = _pairs(b0)
    t3, t7 = _pairs(b1)
    return t0, t1, t2, t3, t4, t5, t6, t7


@triton.jit
def _lane_sums(wf, x, acc, CHAIN: tl.constexpr):
    """``acc`` [RPW, WARPS, 32] plus, per row and lane, the unit ``wf`` (float32) times ``x``
    summed over the lane's own inputs: with CHAIN each stretch's 8 products as one chain of
    multiply-adds in input order, then the stretches summed; else Triton's sum trees."""
    if CHAIN:
        w0, w1, w2, w3, w4, w5, w6, w7 = _eighths(wf)
        x0, x1, x2, x3, x4, x5, x6, x7 = _eighths(x)
        p = w0 * x0
        p += w1 * x1
        p += w2 * x2
        p += w3 * x3
        p += w4 * x4
        p += w5 * x5
        p += w6 * x6
        p += w7 * x7
        return acc + tl.sum(p, axis=0)
    else:
        return acc + tl.sum(tl.sum(wf * x, axis=4), axis=0)


@triton.jit
def _store_row(acc, y_ptr, sy, i: tl.constexpr, M, N, block, RPW: tl.constexpr,
               WARPS: tl.constexpr):
    """Row ``i`` of x's outputs of row block ``block``: the lanes of ``acc`` summed, rounded to
    y's dtype."""
    rows = (block * RPW * WARPS + tl.arange(0, RPW)[:, None] * WARPS
            + tl.arange(0, WARPS)[None, :])
    tl.store(y_ptr + i * sy + rows, tl.sum(acc, axis=2).to(y_ptr.dtype.element_ty),
             mask=(rows < N) & (rows * 0 + i < M))


@triton.jit
def _x_rows(x_ptr, sx, M, chunk, kk, WARPS: tl.constexpr, BLOCK_K: tl.constexpr,
            ROWS: tl.constexpr):
    """Chunk ``chunk`` of x's first ROWS rows (:func:`_x_row`; with ROWS 2 the last two are
    the first two again, unused)."""
    x0 = _x_row(x_ptr, sx, 0, M, chunk, kk, WARPS, BLOCK_K)
    x1 = _x_row(x_ptr, sx, 1, M, chunk, kk, WARPS, BLOCK_K)
    if ROWS > 2:
        x2 = _x_row(x_ptr, sx, 2, M, chunk, kk, WARPS, BLOCK_K)
        x3 = _x_row(x_ptr, sx, 3, M, chunk, kk, WARPS, BLOCK_K)
    else:
        x2 = x0
        x3 = x1
    return x0, x1, x2, x3


@triton.jit
def _unit_sums(w, x0, x1, x2, x3, a0, a1, a2, a3, ROWS: tl.constexpr, CHAIN: tl.constexpr,
               LATE: tl.constexpr):
    """Each row's per-lane sums ``a0..a3`` plus unit ``w`` times that row's chunk."""
    wf = to_f32(w, LATE)
    a0 = _lane_sums(wf, x0.to(tl.float32), a0, CHAIN)
    a1 = _lane_sums(wf, x1.to(tl.float32), a1, CHAIN)
    if ROWS > 2:
        a2 = _lane_sums(wf, x2.to(tl.float32), a2, CHAIN)
        a3 = _lane_sums(wf, x3.to(tl.float32), a3, CHAIN)
    return a0, a1, a2, a3


@triton.jit
def _store_rows(a0, a1, a2, a3, y_ptr, sy, M, N, block, RPW: tl.constexpr, WARPS: tl.constexpr,
                ROWS: tl.constexpr):
    """Row block ``block``'s outputs of every row (:func:`_store_row`)."""
    _store_row(a0, y_ptr, sy, 0, M, N, block, RPW, WARPS)
    _store_row(a1, y_ptr, sy, 1, M, N, block, RPW, WARPS)
    if ROWS > 2:
        _store_row(a2, y_ptr, sy, 2, M, N, block, RPW, WARPS)
        _store_row(a3, y_ptr, sy, 3, M, N, block, RPW, WARPS)


@triton.jit
def _rows_kernel(x_ptr, w_ptr, y_ptr, M, N, sx, sw, sy, K: tl.constexpr,
                 RPW: tl.constexpr, WARPS: tl.constexpr, BLOCK_K: tl.constexpr,
                 ROWS: tl.constexpr, CHAIN: tl.constexpr, LATE: tl.constexpr,
                 PDL: tl.constexpr):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    BLOCK_N: tl.constexpr = RPW * WARPS
    CHUNKS: tl.constexpr = K // BLOCK_K
    units = ((tl.cdiv(N, BLOCK_N) - 1 - pid) // G + 1) * CHUNKS
    r, kk = _unit_offsets(RPW, WARPS, BLOCK_K)
    w = _load_unit(w_ptr, sw, N, 0, pid, G, r, kk, CHUNKS, BLOCK_N, BLOCK_K)
    pdl_wait(PDL)
    x0, x1, x2, x3 = _x_rows(x_ptr, sx, M, 0, kk, WARPS, BLOCK_K, ROWS)
    a0 = tl.zeros([RPW, WARPS, 32], tl.float32)
    a1 = a0
    a2 = a0
    a3 = a0
    for u in range(1, units):   # unit u loads while unit u - 1 is multiplied
        w_next = _load_unit(w_ptr, sw, N, u, pid, G, r, kk, CHUNKS, BLOCK_N, BLOCK_K)
        if CHUNKS > 1:
            n0, n1, n2, n3 = _x_rows(x_ptr, sx, M, u % CHUNKS, kk, WARPS, BLOCK_K, ROWS)
        else:
            n0, n1, n2, n3 = x0, x1, x2, x3
        a0, a1, a2, a3 = _unit_sums(w, x0, x1, x2, x3, a0, a1, a2, a3, ROWS, CHAIN, LATE)
        if u % CHUNKS == 0:   # unit u - 1 ended its row block
            _store_rows(a0, a1, a2, a3, y_ptr, sy, M, N, pid + (u // CHUNKS - 1) * G, RPW,
                        WARPS, ROWS)
            a0 = tl.zeros([RPW, WARPS, 32], tl.float32)
            a1 = a0
            a2 = a0
            a3 = a0
        w = w_next
        x0, x1, x2, x3 = n0, n1, n2, n3
    a0, a1, a2, a3 = _unit_sums(w, x0, x1, x2, x3, a0, a1, a2, a3, ROWS, CHAIN, LATE)
    _store_rows(a0, a1, a2, a3, y_ptr, sy, M, N, pid + (units // CHUNKS - 1) * G, RPW, WARPS,
                ROWS)


def gemv_rows(x: torch.Tensor, weight: torch.Tensor, block_n: int = 32, block_k: int = 512,
              num_warps: int = 8, programs: int | None = None,
              maxnreg: int | None = None, chain: bool = CHAIN) -> torch.Tensor:
    """``x [M, K] @ weight[N, K]^T`` -> [M, N] in x's dtype for 2 <= M <= MAX_ROWS, streamed in
    one wave (module doc). ``block_n`` x ``block_k`` is a unit (``block_k`` a power of two of at
    least 256 that divides K, ``block_n`` a power of two); ``programs``: the grid (default one
    per SM, at most one per row block); ``maxnreg``: registers a thread may use (CUDA).

    Raises ``ValueError`` for fewer than 2 or more than MAX_ROWS rows, an x of another width or
    dtype, a weight not contiguous along K, or units that do not tile K."""
    M, K = x.shape
    N = weight.shape[0]
    if not 2 <= M <= MAX_ROWS or weight.shape[1] != K or x.dtype != weight.dtype:
        raise ValueError(f"gemv_rows takes 2 to {MAX_ROWS} rows of the weight's {weight.shape[1]} "
                         f"inputs and dtype, got {tuple(x.shape)} {x.dtype}")
    if (weight.stride(-1) != 1 or block_k < STRETCH or block_k & (block_k - 1) or K % block_k
            or block_n & (block_n - 1) or block_n < num_warps):
        raise ValueError(f"gemv_rows needs a weight contiguous along K and units of a power of "
                         f"two rows by a power of two >= {STRETCH} inputs dividing K = {K} "
                         f"(got {block_n} x {block_k})")
    x = x.contiguous()
    blocks = triton.cdiv(N, block_n)
    if programs is None:
        programs = sm_count(x.device.index or 0) if x.is_cuda else 4
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _rows_kernel[(min(programs, blocks),)](
        x, weight, y, M, N, x.stride(0), weight.stride(0), y.stride(0), K=K,
        RPW=block_n // num_warps, WARPS=num_warps, BLOCK_K=block_k, ROWS=2 if M == 2 else 4,
        CHAIN=chain,
        LATE=x.is_cuda and weight.dtype == torch.bfloat16, num_warps=num_warps,
        **({"maxnreg": maxnreg} if maxnreg and x.is_cuda else {}), **pdl.launch(x))
    return y
