"""Skinny matrix products on CUDA (Triton): ``y = x W^T`` for a few rows of ``x``.

A decode step at batch 1 (or a verify step of 1 + k tokens) multiplies a handful of rows by every
weight matrix once, so the step is bound by reading the weights from HBM. This kernel streams
``W`` [N, K] in row tiles, each program owning ``BLOCK_N`` output features and reducing over
``K`` in ``BLOCK_K`` chunks with ``tl.dot`` (the rows of ``x`` are padded to 16, which costs no
extra memory traffic). Few outputs over a long reduction (a down projection) leave too few
programs to keep HBM busy, so the reduction is split over ``SPLIT_K`` programs per tile and
summed by the last of them (kernels/arrival.py). Float32 accumulation; one rounding to the output
dtype. (A SwiGLU variant with SiLU-and-mul in its epilogue over two weight streams, the gate
rows and the up rows far apart, was slower on the H200 with either tiling, 1.70 / 1.63 against
1.54 ms per 1.7B batch-1 step, and was removed: BENCHMARKS.md, session 16.)

SwiGLU epilogue (``gemv(x, w, swiglu=True)``): a gate/up weight whose rows are interleaved
pairwise (row 2j the gate row j, row 2j + 1 the up row j; ``LlamaMLP`` reorders them once at load,
layers/activation.py) is one weight stream, and each tile of ``BLOCK_N`` rows holds
``BLOCK_N / 2`` whole pairs. The epilogue rounds the tile's products to the output dtype (the bits
the unfused product stores), pairs neighbouring columns and writes ``silu(g) * u`` as
``fused_triton.silu_and_mul`` computes it: bit-equal to the product then SiLU-and-mul, without
the [M, 2I] intermediate or the second kernel.

Preloaded tiles (``PRELOAD``; ``gemv(preload=True)``): a weight never depends on the kernel
before, so where a product's tiles of 16 rows by its whole reduction are one wave (at most
``PRELOAD_MAX_TILES`` of them, at most ``PRELOAD_MAX_K`` inputs: the 1.7B o product, the 135M's
q/k/v, o and down products) and it has at most ``PRELOAD_MAX_ROWS`` rows (a decode step at batch
1), each program loads its whole tile into registers in one load before its PDL wait, and then
multiplies it row by row of x (a float32 multiply and sum: for given tiles a row's bits do not
depend on the rows beside it). The programs of the next product then load while the previous
one's last programs finish and the wait resolves. On the H200 the 1.7B o product took 3.62 us
in a chain of 20 against 5.66 us pipelined, and the batch-1 step fell from 1.504 to 1.443 ms
(1.7B) and from 0.742 to 0.640 ms (135M; BENCHMARKS.md, session 22). Larger products (more
than one wave) were slower preloaded, row by row or in one dot; so were more rows (the row loop:
at 4 rows the 135M's verify forward took 0.822 ms against 0.718 pipelined), so they keep the
pipelined loop, and a product's bits differ between one row and several, as they already
differ between the skinny product and cuBLAS past 16.

L2 prefetch of the tiles (``TILE_PREFETCH_STEPS``): a pipelined tile does nothing before its PDL
wait, so the first programs of a launch (one a SM) ask L2 for the first steps of their own
weight tile before it, with one ``prefetch.global.L2`` per 128-byte line (no registers held, the
arithmetic unchanged), for weights of at most ``TILE_PREFETCH_MAX_BYTES``. On the H200 it took
the 135M's 4-token verify forward from 0.673 to 0.616 ms (BENCHMARKS.md, session 27).

Tensor-core stream of 2-8 rows (``TC``, kernels/gemv_tc_gluon.py): a verify step's few rows
(or a small decode batch) by a weight of at most TC_MAX_N outputs, without bias, go on Hopper
to a Gluon kernel whose programs keep a ring of weight units in shared memory filled by
``cp.async``, the first units asked for before the PDL wait, multiplied with ``mma.sync``; it
has the SwiGLU epilogue too. On the H200 it took the 4-token forward from 0.612 to 0.557 ms
(135M) and from 1.554 to 1.363 ms (1.7B, its gate/up interleaved for the epilogue), verify4/1
1.07 and 1.10 (BENCHMARKS.md, session 28). Preloaded tiles at 4 rows, multiplied in one dot or
in a batch of eight (one slice of the reduction a warp), had lost (sessions 26 and 28).

Streamed one-row products (``STREAM``, kernels/gemv_stream_triton.py): at one row a product
that preloaded tiles do not cover (more than one wave) runs as one wave of programs that each
load their first unit before the PDL wait and stream the rest through a register double buffer,
and may take the norm or SiLU-and-mul before it in its own programs (``FUSED_INPUTS``;
models/llama.py). The LM head keeps the tiles.

Measured and removed (BENCHMARKS.md, session 21; the code is in commit ee87268): the whole MLP
in one persistent kernel, gate/up tiles then a barrier over all its programs then the down
product, was 1-3 us per MLP slower than these separate kernels (the barrier alone ~3 us); with
its two phases as two launches it equalled them in the step.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mtpserve.kernels import arrival, pdl
from mtpserve.kernels.arrival import arrive_last
from mtpserve.kernels.gemv_stream_triton import gemv_stream, sm_count, to_f32
from mtpserve.kernels.jit_options import unspecialized
from mtpserve.kernels.pdl import pdl_wait

try:   # Gluon (triton.experimental.gluon) is in Triton 3.4 and later; its API still moves
    from mtpserve.kernels.gemv_tc_gluon import gemv_tc, tc_config, tc_takes
except (ImportError, AttributeError):
    gemv_tc = tc_config = tc_takes = None

# most rows of x this kernel takes; larger products go to cuBLAS
MAX_ROWS = 16
# off: every product goes to cuBLAS (benchmarks/gpu_decode.py --no-gemv compares the two)
ENABLED = True
# on: a caller that asks to defer a split-K sum (``gemv(..., defer_sum=True)``) gets the partials
# (SplitKPartials); off, the product's last program sums them as for every other caller. On the
# H200 it takes the 1.7B batch-1 step from 1.540 to 1.502 ms with the same bits
# (test_gpu.py::test_deferred_split_k_sum_gives_the_same_bits; BENCHMARKS.md, session 19)
DEFER_SUM = True
# on: LlamaMLP's interleaved gate/up product applies SiLU-and-mul in its epilogue
# (``gemv(..., swiglu=True)``); off, it runs the product then ``silu_and_mul(interleaved=True)``
# (benchmarks/gpu_decode.py --compare no_swiglu_epilogue). The rows are interleaved at load only
# where it applies then (``swiglu_fits``): a weight left in checkpoint order keeps SiluAndMul
SWIGLU_EPILOGUE = True
# ... for gate/up weights of at least this many inputs (or not streamed at one row). 0: every
# one. Was 4096 from session 20: the epilogue took the 8B batch-1 step (24576 x 4096) from 4.372
# to 4.292 ms but the 1.7B one (12288 x 2048) from 1.530 to 1.599 ms, its down product costing
# 4.1 us more after a product than after the one-program SiLU-and-mul kernel; since the
# streamed one-row product (session 23) the 1.7B's one-row step is even (1.256 against 1.261
# ms, session 26), and with 4-row products on the tc stream (TC, session 28) the epilogue took
# the 1.7B 4-token forward from 1.428-1.437 to 1.357 ms (verify4/1 1.16 -> 1.10; run 5)
SWIGLU_MIN_K = 0
# on: products of few rows whose tiles fit one wave take preloaded tiles (module doc); off, they
# take the pipelined loop, or at one row the streamed product where STREAM applies
# (benchmarks/gpu_decode.py --compare no_preload)
PRELOAD = True
PRELOAD_MAX_ROWS = 1
# the tile's registers: 16 x 2048 bf16 at 8 warps, 100 registers at one row (kept 16-bit until
# multiplied: gemv_stream_triton.late_f32; 172 before session 23)
PRELOAD_MAX_K = 2048
# one wave of one program per SM on an H100 / H200; 264 (two per SM fit since session 23) took the
# 1.7B q/k/v product from the streamed one with its norm fused: 1.344 against 1.304 ms a step
PRELOAD_MAX_TILES = 132
PRELOAD_BLOCK_N = 16
# on: one-row products that preloaded tiles do not cover (more than one wave; not the LM head, past
# STREAM_MAX_N rows) go to kernels/gemv_stream_triton.py: one wave of programs streaming units of
# block_n x block_k, from STREAM_UNITS (block_k, block_n, warps, programs per SM), the first whose
# block_k divides K. Each fills the register file (two 64 KB or three 32 KB units in flight per
# SM); the best of a sweep per weight (benchmarks/gpu_gemv.py --stream; BENCHMARKS.md, session 23)
STREAM = True
STREAM_UNITS = ((4096, 8, 8, 2), (2048, 8, 8, 3))
STREAM_MAX_N = 65535
# steps of BLOCK_K inputs of its own weight tile that each program of the pipelined tiles (2-16
# rows, or one row where neither preloaded nor streamed) asks L2 for before its PDL wait
# (``prefetch.global.L2`` per 128-byte line, no registers held): the weight streams in while the
# kernel before it (a norm, SiLU-and-mul, q/k norm or attention merge) runs. 0: off. On the H200
# (BENCHMARKS.md, session 27) 2 steps took the 135M's 4-token forward from 0.673 to 0.616 ms and
# its one-token forward from 0.528 to 0.521 (its gate/up tiles); more steps, or weights past
# ~9 MB, lost (1.7B 4-token forward 1.489 -> 1.594 ms with every step of every weight, 8B 4.341
# -> 4.409 with 2 steps)
TILE_PREFETCH_STEPS = 2
# ... only the first programs of the launch do (in launch order, split-K slices after the tiles):
# those resident while the kernel before runs. None: one a SM
TILE_PREFETCH_PROGRAMS = None
# ... only for weights of at most this many bytes (None: any): the 135M's products and the 1.7B
# o product (4-token forward 1.487 against 1.497 ms), not an LM head nor an 8B weight
TILE_PREFETCH_MAX_BYTES = 9 << 20
# on: products of 2..TC_MAX_ROWS rows without bias, of at most TC_MAX_N outputs, take the Gluon
# tensor-core stream (kernels/gemv_tc_gluon.py: a cp.async ring whose first weight units are
# asked for before the PDL wait) on sm_90+ where Gluon imports. On the H200, 4 rows, one product
# in a chain of 20 (benchmarks/gpu_gemv_tc.py, BENCHMARKS.md session 28): 1.7B q/k/v 6.92 ->
# 5.56 us, o 5.61 -> 3.36, 135M down 3.59 -> 2.22
# (the environment variable MTPSERVE_GEMV_TC=0 turns it off at start, e.g. where a newer or
# older Triton's Gluon fails to build it)
TC = os.environ.get("MTPSERVE_GEMV_TC", "1") != "0"
# ... up to 8 rows: at 16 (16 requests decoding) the tiles gave the 1.7B 10028-10108 tok/s
# against 9271-9351 with the stream (runs 4-5); a verify of 2 requests x 4 tokens still takes it
TC_MAX_ROWS = 8
# ... nor past this many outputs: a 151936-row LM head (which the tiles read at ~4.3 TB/s;
# the model's asks for float32 logits, which also keeps it on the tiles) was never timed there
TC_MAX_N = 32768
# on: a streamed one-row product may take its input's residual add + RMSNorm or SiLU-and-mul in
# its own programs (``gemv_fused_input``; models/llama.py), one kernel fewer each
FUSED_INPUTS = True


@dataclass
class SplitKPartials:
    """A skinny product's output left as its split-K partial sums, for a consumer kernel that
    sums them itself (``fused_triton.add_rms_norm``), which saves the product its last program's
    arrival and second pass (kernels/arrival.py).

    ``parts``: [SPLIT_K, M, N] float32, partial ``s`` over the s-th range of the reduction
    (any strides, unit stride along N; a sparse MoE block's per-choice outputs in the model
    dtype are such partials too, layers/moe.py); ``dtype``: the product's output dtype. The
    output is ``sum(parts[0], parts[1], ...)`` in that order from zero in float32, rounded once
    to ``dtype``, the same bits the product itself gives (:meth:`total`)."""
    parts: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]

    @property
    def device(self) -> torch.device:
        return self.parts.device

    @property
    def is_cuda(self) -> bool:
        return self.parts.is_cuda

    def total(self) -> torch.Tensor:
        """The summed [M, N] output in ``dtype`` (PyTorch ops; for consumers without a fused
        sum)."""
        acc = self.parts[0].to(torch.float32, copy=True)
        for s in range(1, self.parts.shape[0]):
            acc += self.parts[s]
        return acc.to(self.dtype)


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight^T`` should take :func:`gemv`: CUDA, 16-bit weights, 2-D ``x`` of at
    most MAX_ROWS rows (every weight shape swept beats cuBLAS, see :func:`tile_config`)."""
    return (ENABLED and x.is_cuda and x.dim() == 2 and x.shape[0] <= MAX_ROWS
            and weight.dtype in (torch.bfloat16, torch.float16) and x.dtype == weight.dtype
            and weight.stride(-1) == 1)


def tile_config(n: int, k: int, rows: int = 1) -> dict:
    """Tile sizes, split-K factor and whether the tile is preloaded (``PRELOAD``, module doc)
    for ``rows`` rows of x by an [n, k] weight.

    From the sweep of benchmarks/gpu_gemv.py on the H200 with weights read from HBM
    (BENCHMARKS.md): wide outputs take wider tiles; few outputs over a reduction of 2048 or more
    (an o or down projection) split the reduction four ways (2048x6144: 10.0 us vs cuBLAS's
    own split-K 11.0 us; 2048x2048: 5.9 vs 6.8 unsplit).
    """
    if (PRELOAD and rows <= PRELOAD_MAX_ROWS and k <= PRELOAD_MAX_K
            and -(-n // PRELOAD_BLOCK_N) <= PRELOAD_MAX_TILES):
        return dict(block_n=PRELOAD_BLOCK_N, block_k=triton.next_power_of_2(k), num_warps=8,
                    stages=1, split_k=1, preload=True)
    return _pipelined_tile(n, k)


def stream_config(rows: int, n: int, k: int) -> dict | None:
    """The streamed one-row product's units for ``rows`` rows by an [n, k] weight, as
    :func:`gemv_stream_triton.gemv_stream` keywords less ``programs`` plus ``per_sm``, or None
    where it does not apply: STREAM off, more than one row, a preloaded tile, more than
    STREAM_MAX_N outputs, or no unit of STREAM_UNITS whose block_k divides K."""
    if not STREAM or rows != 1 or n > STREAM_MAX_N or tile_config(n, k, rows)["preload"]:
        return None
    for block_k, block_n, warps, per_sm in STREAM_UNITS:
        if k % block_k == 0:
            return dict(block_n=block_n, block_k=block_k, num_warps=warps, per_sm=per_sm)
    return None


def stream_fits(rows: int, n: int, k: int) -> bool:
    """Whether ``gemv`` streams ``rows`` rows by an [n, k] weight (:func:`stream_config`)."""
    return stream_config(rows, n, k) is not None


@functools.cache
def _pipelined_tile(n: int, k: int) -> dict:
    """:func:`tile_config` for the pipelined loop."""
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
    return dict(block_n=block_n, block_k=block_k, num_warps=4, stages=4, split_k=split,
                preload=False)


def swiglu_fits(weight: torch.Tensor) -> bool:
    """Whether ``gemv(x, weight, swiglu=True)`` applies and pays: SWIGLU_EPILOGUE on, at least
    SWIGLU_MIN_K inputs (0 by default: any) or a one-row product that is not streamed (the
    135M's 3072 x 576), an even number of rows [2I] and an unsplit reduction at every row count
    of :func:`tile_config` (a narrow tensor-parallel shard over a long reduction may split).
    On the H200 the 135M's gate/up with the epilogue took its batch-1 step from 0.607 to 0.564
    ms (session 26); the 1.7B's its 4-token forward from 1.43 to 1.36 ms with 4-row products on
    the tc stream, its one-row step even (session 28; BENCHMARKS.md)."""
    n, k = weight.shape
    return (SWIGLU_EPILOGUE and (k >= SWIGLU_MIN_K or not stream_fits(1, n, k)) and n % 2 == 0
            and all(tile_config(n, k, rows)["split_k"] == 1 for rows in (1, MAX_ROWS)))


# M is not specialized on (kernels/jit_options.py): decode and verify graphs of 1, 2-15 and 16
# rows would otherwise compile each product three times at start-up
@triton.jit(**unspecialized(ints=("M", "pf_programs")))
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, M, N, sx, sw, sy,
                 pf_programs,
                 K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr,
                 HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                 STAGES: tl.constexpr, DEFER: tl.constexpr, SWIGLU: tl.constexpr,
                 PRELOAD: tl.constexpr, LATE: tl.constexpr, PREFETCH: tl.constexpr,
                 PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, ROWS)
    nmask, mmask = n < N, m < M
    k_start = pid_k * K_SPLIT
    if PRELOAD:
        acc = _preloaded_tile(x_ptr, w_ptr, M, sx, sw, m, n, nmask, k_start, K, K_SPLIT,
                              BLOCK_N, ROWS, PRELOAD == 1, LATE, PDL)
    else:
        if PREFETCH > 0 and pid_n + pid_k * tl.num_programs(0) < pf_programs:
            _prefetch_tile(w_ptr, N, sw, n, k_start, K, K_SPLIT, BLOCK_K, PREFETCH)
        pdl_wait(PDL)
        acc = _pipelined_tile_dot(x_ptr, w_ptr, sx, sw, m, mmask, n, nmask, k_start, K,
                                  K_SPLIT, PRECISION, BLOCK_N, BLOCK_K, ROWS, STAGES)
    out_mask = mmask[:, None] & nmask[None, :]
    if SPLIT_K > 1:   # partials [SPLIT_K, M, N] float32; the last program of this tile sums them
        part = part_ptr + m[:, None] * N + n[None, :]
        tl.store(part + pid_k * M * N, acc, mask=out_mask)
        if DEFER:   # the consumer sums the partials (SplitKPartials)
            pass
        elif arrive_last(count_ptr + pid_n, SPLIT_K):
            acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT_K):
                acc += tl.load(part + s * M * N, mask=out_mask, other=0.0, cache_modifier=".cg")
            _store(acc, b_ptr, y_ptr, m, n, nmask, out_mask, sy, HAS_BIAS)
    elif SWIGLU:
        _store_swiglu(acc, y_ptr, m, mmask, pid_n, N, sy, ROWS, BLOCK_N)
    else:
        _store(acc, b_ptr, y_ptr, m, n, nmask, out_mask, sy, HAS_BIAS)


@triton.jit
def _pipelined_tile_dot(x_ptr, w_ptr, sx, sw, m, mmask, n, nmask, k_start, K,
                        K_SPLIT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr):
    """``x[m, k] @ w[n, k]^T`` over ``k`` in [k_start, k_start + K_SPLIT) and below K: one
    program's float32 [ROWS, BLOCK_N] tile, ``BLOCK_K`` inputs a step in a pipelined loop (the
    rows of x padded to ROWS for ``tl.dot``)."""
    acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    for k0 in tl.range(0, K_SPLIT, BLOCK_K, num_stages=STAGES):
        k = k_start + k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * sw + k[None, :],
                    mask=nmask[:, None] & kmask[None, :], other=0.0)
        x = tl.load(x_ptr + m[:, None] * sx + k[None, :],
                    mask=mmask[:, None] & kmask[None, :], other=0.0)
        acc += tl.dot(x.to(w.dtype), tl.trans(w), input_precision=PRECISION)
    return acc


@triton.jit
def _prefetch_tile(w_ptr, N, sw, n, k_start, K, K_SPLIT: tl.constexpr, BLOCK_K: tl.constexpr,
                   STEPS: tl.constexpr):
    """Ask L2 for the first STEPS steps of this program's weight tile, rows ``n`` by inputs
    [k_start, k_start + K_SPLIT): one ``prefetch.global.L2`` (sm_90 PTX: fire and forget) per
    128-byte line of a 16-bit weight; rows past N and inputs past K are clamped to the last.
    CUDA only (never under the CPU interpreter, which runs no asm)."""
    LINES: tl.constexpr = BLOCK_K // 64 if BLOCK_K >= 64 else 1
    rows = tl.minimum(n, N - 1).to(tl.int64) * sw
    for k0 in tl.static_range(0, min(K_SPLIT, STEPS * BLOCK_K), BLOCK_K):
        k = tl.minimum(k_start + k0 + tl.arange(0, LINES) * 64, K - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                  [w_ptr + rows[:, None] + k[None, :]], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _preloaded_tile(x_ptr, w_ptr, M, sx, sw, m, n, nmask, k_start, K, K_SPLIT: tl.constexpr,
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_ROW: tl.constexpr,
                    LATE: tl.constexpr, PDL: tl.constexpr):
    """The same tile with the weight loaded whole before the PDL wait (module doc), then each
    of the M rows of x multiplied and summed in float32: no padding rows, and a row's bits do
    not depend on the rows beside it."""
    k = k_start + tl.arange(0, K_SPLIT)
    kmask = k < K
    w = tl.load(w_ptr + n[:, None].to(tl.int64) * sw + k[None, :],
                mask=nmask[:, None] & kmask[None, :], other=0.0)
    pdl_wait(PDL)
    acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    if ONE_ROW:   # the tile stays 16-bit until it is multiplied: two programs fit an SM
        x0 = tl.load(x_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        row = tl.sum(to_f32(w, LATE) * x0[None, :], axis=1)
        acc = tl.where(m[:, None] == 0, row[None, :], acc)
    else:
        wf = w.to(tl.float32)
        for i in range(M):
            xi = tl.load(x_ptr + i * sx + k, mask=kmask, other=0.0).to(tl.float32)
            acc = tl.where(m[:, None] == i, tl.sum(wf * xi[None, :], axis=1)[None, :], acc)
    return acc


@triton.jit
def _store_swiglu(acc, y_ptr, m, mmask, pid_n, N, sy, ROWS: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """SiLU-and-mul of the tile's interleaved (gate, up) column pairs: ``acc`` [ROWS, BLOCK_N]
    float32 -> output columns ``pid_n * BLOCK_N / 2 + j`` of ``y`` [M, N / 2]. Rounds the
    products to y's dtype first and computes as ``fused_triton._silu_mul_kernel`` does, so the
    bits equal the product stored, then SiLU-and-mul."""
    h = acc.to(y_ptr.dtype.element_ty).to(tl.float32)
    g, u = tl.split(tl.reshape(h, (ROWS, BLOCK_N // 2, 2)))
    y = g / (1.0 + tl.exp(-g)) * u
    j = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    mask = mmask[:, None] & (j < N // 2)[None, :]
    tl.store(y_ptr + m[:, None] * sy + j[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store(acc, b_ptr, y_ptr, m, n, nmask, out_mask, sy, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + m[:, None] * sy + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         block_n: int | None = None, block_k: int = 256, num_warps: int = 4, stages: int = 4,
         split_k: int = 1, out_dtype: torch.dtype | None = None,
         defer_sum: bool = False, swiglu: bool = False,
         preload: bool = False) -> torch.Tensor | SplitKPartials:
    """``x [M, K] @ weight[N, K]^T (+ bias [N])`` for ``M <= MAX_ROWS``.

    ``x`` and ``weight`` share a float dtype (weight contiguous along K); returns [M, N] in
    ``out_dtype`` (default x's dtype). ``split_k`` > 1 splits the reduction over that
    many programs per output tile, summed in a fixed order by the last (kernels/arrival.py).
    Tile sizes default to :func:`tile_config`; for given tiles the result of a row does not
    depend on M (the default kernel changes past ``PRELOAD_MAX_ROWS`` rows, to the tensor-core
    stream where :func:`tc_fits`, and past ``TC_MAX_ROWS`` back to the tiles, so a row's bits
    differ between those ranges).
    ``defer_sum`` (no bias, DEFER_SUM on): a split product returns its partials as
    :class:`SplitKPartials` for the consumer to sum; an unsplit one returns the tensor.
    ``swiglu``: ``weight`` is a gate/up weight [2I, K] with rows interleaved (gate j, up j);
    returns ``silu(g) * u`` [M, I], bit-equal to the product followed by
    ``fused_triton.silu_and_mul(y, interleaved=True)`` (module doc). ``preload``: each
    program loads its whole tile of ``block_n`` rows by ``block_k`` inputs (a power of two; the
    reduction split ``split_k`` ways of at most ``block_k``) before its PDL wait and multiplies
    it row by row (module doc). Raises
    ``ValueError`` for more than MAX_ROWS rows, a weight not contiguous along K, an ``x`` of
    another width, ``swiglu`` with a bias, a split reduction or an odd N, or a preloaded tile
    shorter than its share of the reduction.
    """
    M = x.shape[0]
    N, K = weight.shape
    stream = stream_config(M, N, K) if block_n is None else None
    if stream:
        _check(x, weight)
        return _streamed(x, weight, bias, stream, swiglu=swiglu, out_dtype=out_dtype)
    if block_n is None and bias is None and out_dtype in (None, x.dtype) and tc_fits(x, weight):
        return gemv_tc(x, weight, swiglu=swiglu,
                       **tc_config(N, K, sm_count(x.device.index or 0)), pdl=pdl.enabled(x))
    if block_n is None:
        cfg = tile_config(N, K, M)
        block_n, block_k, num_warps, stages, split_k, preload = (
            cfg["block_n"], cfg["block_k"], cfg["num_warps"], cfg["stages"], cfg["split_k"],
            cfg["preload"])
    _check(x, weight)
    if x.stride(-1) != 1:
        x = x.contiguous()
    k_split = triton.cdiv(triton.cdiv(K, split_k), block_k) * block_k
    split_k = triton.cdiv(K, k_split)
    if preload and k_split != block_k:
        raise ValueError(f"gemv: a preloaded tile of {block_k} inputs is shorter than its "
                         f"{k_split} of the reduction (K {K}, split_k {split_k})")
    if swiglu and (bias is not None or split_k > 1 or N % 2 or block_n % 2):
        raise ValueError(f"gemv: the SwiGLU epilogue takes an unsplit product of an even number "
                         f"of rows without bias (split_k {split_k}, N {N}, bias "
                         f"{bias is not None})")
    defer = defer_sum and DEFER_SUM and split_k > 1 and bias is None
    n_tiles = triton.cdiv(N, block_n)
    if split_k > 1 and n_tiles > arrival.NUM_COUNTERS:
        raise ValueError(f"gemv: {n_tiles} output tiles is more than split-K can count")
    part = (torch.empty(split_k, M, N, device=x.device, dtype=torch.float32) if split_k > 1
            else weight)
    count = arrival.counters(x.device) if split_k > 1 and not defer else weight
    y = part if defer else torch.empty(M, N // 2 if swiglu else N, dtype=out_dtype or x.dtype,
                                       device=x.device)
    pf_programs = 0 if preload else _prefetch_programs(x, weight)
    _gemv_kernel[(n_tiles, split_k)](
        x, weight, bias if bias is not None else weight, y, part, count, M, N, x.stride(0),
        weight.stride(0), y.stride(0), pf_programs, K=K, K_SPLIT=k_split, SPLIT_K=split_k,
        HAS_BIAS=bias is not None, PRECISION="ieee" if x.dtype == torch.float32 else None,
        BLOCK_N=block_n, BLOCK_K=block_k, ROWS=MAX_ROWS, STAGES=stages, num_warps=num_warps,
        DEFER=defer, SWIGLU=swiglu, PRELOAD=(1 if M == 1 else 2) if preload else 0,
        LATE=x.is_cuda and weight.dtype == torch.bfloat16,
        PREFETCH=TILE_PREFETCH_STEPS if pf_programs else 0, **pdl.launch(x))
    return SplitKPartials(part, out_dtype or x.dtype) if defer else y


def tc_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``gemv`` (default tiles, no bias, the output in x's dtype) gives ``x`` by
    ``weight`` to the Gluon tensor-core stream: TC on and importable, 2..TC_MAX_ROWS rows, at
    most TC_MAX_N outputs, a Hopper or newer GPU and what
    ``gemv_tc_gluon.tc_takes``."""
    return (TC and gemv_tc is not None and x.is_cuda and 2 <= x.shape[0] <= TC_MAX_ROWS
            and weight.shape[0] <= TC_MAX_N and pdl.supported(x.device.index or 0)
            and tc_takes(x, weight))


def _prefetch_programs(x: torch.Tensor, weight: torch.Tensor) -> int:
    """How many leading programs of a pipelined launch over ``weight`` prefetch their tiles
    (TILE_PREFETCH_PROGRAMS, by default one a SM; 0 off CUDA, with TILE_PREFETCH_STEPS 0, or
    for a weight of more than TILE_PREFETCH_MAX_BYTES)."""
    if (not x.is_cuda or not TILE_PREFETCH_STEPS
            or (TILE_PREFETCH_MAX_BYTES is not None
                and weight.numel() * weight.element_size() > TILE_PREFETCH_MAX_BYTES)):
        return 0
    if TILE_PREFETCH_PROGRAMS is None:
        return sm_count(x.device.index or 0)
    return TILE_PREFETCH_PROGRAMS


def _streamed(x, weight: torch.Tensor, bias: torch.Tensor | None, stream: dict,
              **kw) -> torch.Tensor:
    """:func:`gemv_stream_triton.gemv_stream` with :func:`stream_config`'s units, one wave of
    ``per_sm`` programs per SM, each held to its share of the SM's 64K registers (the fused
    add + RMSNorm would otherwise take 90 of the 85 that three programs of 8 warps may have)."""
    stream = dict(stream)
    per_sm = stream.pop("per_sm")
    if not weight.is_cuda:
        return gemv_stream(x, weight, bias, **stream, **kw)
    return gemv_stream(x, weight, bias, programs=per_sm * sm_count(weight.device.index or 0),
                       maxnreg=register_share(per_sm, stream["num_warps"]), **stream, **kw)


def register_share(per_sm: int, num_warps: int) -> int:
    """Registers a thread may use so that ``per_sm`` programs of ``num_warps`` warps share one
    SM's 64K 32-bit registers: a multiple of 8, at most 255 (``maxnreg``)."""
    return min(65536 // (per_sm * 32 * num_warps) // 8 * 8, 255)


def fused_input_fits(x: torch.Tensor, weight: torch.Tensor, norm: bool) -> bool:
    """Whether a product of ``x`` by ``weight`` [N, K] takes its input fused in front
    (:func:`gemv_fused_input`): ENABLED and FUSED_INPUTS on, one row on CUDA in the weight's
    16-bit dtype, a streamed product (:func:`stream_config`); for a residual add + RMSNorm
    (``norm``) also ``x`` a tensor (not split-K partials) of K inputs and one chunk of all of
    them. For a SiLU-and-mul (not ``norm``) ``x`` is [1, 2K]."""
    stream = _fused_stream(x, weight)
    if stream is None:
        return False
    K = weight.shape[1]
    return x.shape[1] == K and stream["block_k"] == K if norm else x.shape[1] == 2 * K


def gated_norm_fits(x: torch.Tensor, weight: torch.Tensor, head_dim: int) -> bool:
    """Whether the product of ``x`` [1, K] by ``weight`` [N, K] takes a Gated DeltaNet's output
    norm over heads of ``head_dim`` fused in front (``gemv_stream_triton.GatedNormInput``): as
    :func:`fused_input_fits`, with the heads dividing the streamed chunk."""
    stream = _fused_stream(x, weight)
    return (stream is not None and x.shape[1] == weight.shape[1]
            and stream["block_k"] % head_dim == 0)


def _fused_stream(x: torch.Tensor, weight: torch.Tensor) -> dict | None:
    """:func:`stream_config` of a one-row product that may take its input fused in front
    (ENABLED and FUSED_INPUTS on, one row of ``x`` on CUDA in the weight's 16-bit dtype), else
    None."""
    if not (ENABLED and FUSED_INPUTS and isinstance(x, torch.Tensor) and x.is_cuda
            and x.dim() == 2 and x.shape[0] == 1 and x.dtype == weight.dtype
            and weight.dtype in (torch.bfloat16, torch.float16) and weight.stride(-1) == 1):
        return None
    return stream_config(1, *weight.shape)


def gemv_fused_input(x, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     swiglu: bool = False, silu_input: bool = False) -> torch.Tensor:
    """The streamed one-row product with its input computed in front, where
    :func:`fused_input_fits` (or :func:`gated_norm_fits`) says so: ``x`` a
    ``gemv_stream_triton.NormInput`` (residual add + RMSNorm), a ``GatedNormInput`` (a Gated
    DeltaNet's output norm) or, with ``silu_input``, [1, 2K] = [gate | up] (SiLU-and-mul); see
    ``gemv_stream``. Returns [1, N] (``swiglu``: [1, N / 2]) in x's dtype."""
    N, K = weight.shape
    return _streamed(x, weight, bias, stream_config(1, N, K), swiglu=swiglu,
                     silu_input=silu_input)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    """Raise ``ValueError`` unless :func:`gemv` takes ``x`` and ``weight``."""
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows, got {x.shape[0]}")
    if weight.stride(-1) != 1:
        raise ValueError("gemv needs a weight contiguous along its input dimension")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"gemv: x has {x.shape[1]} columns for a weight of {weight.shape[1]} "
                         f"inputs")
