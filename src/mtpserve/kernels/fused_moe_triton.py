"""Sparse-MoE expert computation as two grouped GEMMs (Triton), with no host synchronisation.

The plain-PyTorch path in ``layers/moe.py`` loops over experts on the host and reads their token
counts back (``.tolist()``): a sync and one set of kernels per active expert, which is slow on a
GPU and cannot be captured in a CUDA graph. Here, as in the grouped "fused MoE" GEMM of
MegaBlocks (Gale et al. 2023) and vLLM, the (token, choice) rows are sorted by expert and padded
so that every block of ``block_m`` rows belongs to one expert; a kernel then runs one GEMM tile
per (block, output columns), reading that expert's weights once per block:

1. :func:`align_by_expert` gives ``rows`` [R] int64, the flat (token * top_k + choice) index at
   each padded position (``T * k`` marks padding), and ``block_expert`` [R / block_m] int64 (-1:
   block past the end): on CUDA one Triton launch (:func:`align_by_expert_triton`: prefill is
   host-bound, and the PyTorch ops of :func:`align_by_expert_torch`, its reference, are ~16
   launches per MoE layer);
2. ``_gate_up_kernel``: ``act = silu(x W_gate^T) * (x W_up^T)`` per padded row;
3. ``_down_kernel``: ``out[row] = routing_weight[row] * act W_down^T`` scattered back to the flat
   (token, choice) rows; the caller sums over the k choices.

Steps of at most ``ONE_ROW_BLOCKS`` rows skip the sort (each row its own block).

R is static, ``T*k + min(T*k, E) * (block_m - 1)`` rounded up to a block, so a CUDA graph can
hold the whole computation. H and I are compile-time constants (static loop trip counts, which
the Triton interpreter also needs). All accumulation is float32, rounded once to the input dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.dispatch import INTERPRET
from mtpserve.kernels.pdl import pdl_wait


# most experts the sort by expert holds in one program's registers (Qwen3-Next has 512)
MAX_EXPERTS = 1024


def padded_rows(num_rows: int, num_experts: int, block_m: int) -> int:
    """Upper bound of the padded row count for ``num_rows`` (token, choice) rows."""
    bound = num_rows + min(num_rows, num_experts) * (block_m - 1)
    return triton.cdiv(bound, block_m) * block_m


def align_by_expert_torch(ids: torch.Tensor, num_experts: int, block_m: int):
    """The layout of :func:`align_by_expert` in PyTorch ops (scatter_add, a stable argsort,
    cumsum, searchsorted; ~16 kernels on CUDA): the reference of :func:`align_by_expert_triton`,
    and the path on the CPU without Triton's interpreter and above ``ALIGN_KERNEL_MAX_ROWS``.

    Args and returns as :func:`align_by_expert`. Raises RuntimeError (CPU; a device-side assert
    on CUDA) for an expert index outside [0, num_experts).
    """
    flat = ids.flatten()
    n = flat.numel()
    dev = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pend = padded.cumsum(0)
    order = flat.argsort(stable=True)
    sorted_e = flat[order]
    rank = torch.arange(n, device=dev) - (counts.cumsum(0) - counts)[sorted_e]
    dest = (pend - padded)[sorted_e] + rank
    R = padded_rows(n, num_experts, block_m)
    rows = torch.full((R,), n, dtype=torch.int64, device=dev)
    rows.scatter_(0, dest, order)
    starts = torch.arange(0, R, block_m, device=dev)
    block_expert = torch.searchsorted(pend, starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return rows, block_expert


# ---- the sort by expert in one kernel ------------------------------------------------------------
# above this many (token, choice) rows align_by_expert takes the PyTorch ops: each program of the
# kernel reads all n ids, so its time grows with n (H200, 2026-12-02: the kernel was still faster
# than the PyTorch ops in a CUDA graph at 20480 rows, 47-80 us against 122 us; limit not moved)
ALIGN_KERNEL_MAX_ROWS = 16384
ALIGN_WARPS = 8
# padded positions per step of the kernel's block loop
ALIGN_FILL = 4096


def align_tiles(num_rows: int) -> tuple[int, int]:
    """(rows per program, ids per step of the counting loops) of the align kernel, from
    ``benchmarks/gpu_moe_align.py --sweep`` on the H200 (2026-12-02; 8 warps): E=64 top 8 at
    1024 rows 3.9 us (128 rows a program: 5.1, 256: 10.5); E=512 top 10 at 1280 rows 8.8 us
    (9.8, 15.8); E=64 at 16384 rows 12.2 us with (128, 2048) (64 rows a program: 15.9)."""
    return (64, 1024) if num_rows <= 4096 else (128, 2048)


@triton.jit
def _expert_counts(ids_ptr, lo, hi, E_PAD: tl.constexpr, CHUNK: tl.constexpr):
    """[E_PAD] int32: how many of ids[lo:hi] name each expert."""
    counts = tl.zeros([E_PAD], tl.int32)
    for c0 in range(lo, hi, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        live = offs < hi
        e = tl.load(ids_ptr + offs, mask=live, other=0).to(tl.int32)
        counts += tl.histogram(e, E_PAD, mask=live)
    return counts


@triton.jit
def _count_at_most(sorted_vals, x, E_PAD: tl.constexpr, LOG_E: tl.constexpr):
    """For each x: how many of the non-decreasing ``sorted_vals`` [E_PAD] are <= x (a binary
    search, one bit of the answer per step, from the highest)."""
    pos = tl.zeros(x.shape, tl.int32)
    for i in tl.static_range(LOG_E):
        step = E_PAD >> (i + 1)
        v = tl.gather(sorted_vals, pos + (step - 1), 0)
        pos = tl.where(v <= x, pos + step, pos)
    v = tl.gather(sorted_vals, pos, 0)             # pos <= E_PAD - 1 here
    return tl.where(v <= x, pos + 1, pos)


@triton.jit
def _write_blocks(rows_ptr, be_ptr, n, counts, pstart, pend, E: tl.constexpr,
                  E_PAD: tl.constexpr, LOG_E: tl.constexpr, BM: tl.constexpr,
                  BLOCKS: tl.constexpr):
    """This program's share of the blocks: each block's expert (the first whose padded run
    ends after the block's start; -1 past the last run), and ``n`` at every padding position
    (the slots past an expert's rows in its run, every slot of the blocks past the end). The
    other slots are :func:`_scatter_chunk`'s (disjoint addresses: no ordering is needed)."""
    lane = tl.arange(0, E_PAD)
    bound = tl.where(lane < E, pend, 2147483647)   # lanes past E: never at most a start
    nb = (n + tl.minimum(n, E) * (BM - 1) + BM - 1) // BM
    share = tl.cdiv(nb, tl.num_programs(0))
    first = tl.program_id(0) * share
    last = tl.minimum(first + share, nb)
    slot = tl.arange(0, BM)
    for b0 in range(first, last, BLOCKS):
        b = b0 + tl.arange(0, BLOCKS)
        live = b < last
        start = b * BM
        ex = _count_at_most(bound, start, E_PAD, LOG_E)
        tl.store(be_ptr + b, tl.where(ex < E, ex, -1).to(tl.int64), mask=live)
        ec = tl.minimum(ex, E_PAD - 1)
        used_end = tl.gather(pstart, ec, 0) + tl.gather(counts, ec, 0)
        pos = start[:, None] + slot[None, :]
        pad = (ex[:, None] >= E) | (pos >= used_end[:, None])
        tl.store(rows_ptr + pos, tl.full(pos.shape, n, tl.int64), mask=live[:, None] & pad)


@triton.jit
def _scatter_chunk(ids_ptr, rows_ptr, n, lo, cursor, CHUNK: tl.constexpr):
    """Store each flat index i of ids[lo:lo + CHUNK] at ``cursor[e]`` + (rows of this chunk
    before i naming e), e = ids[i], the rank from a [CHUNK, CHUNK] comparison."""
    i = tl.arange(0, CHUNK)
    offs = lo + i
    live = offs < n                                # dead lanes come last: they rank no live one
    e = tl.load(ids_ptr + offs, mask=live, other=0).to(tl.int32)
    before = i[None, :] < i[:, None]               # [i, j]: j comes before i
    rank = tl.sum(((e[None, :] == e[:, None]) & before).to(tl.int32), 1)
    dest = tl.gather(cursor, e, 0) + rank
    tl.store(rows_ptr + dest, offs.to(tl.int64), mask=live)


@triton.jit
def _align_kernel(ids_ptr, rows_ptr, be_ptr, n, E: tl.constexpr, E_PAD: tl.constexpr,
                  LOG_E: tl.constexpr, BM: tl.constexpr, CHUNK: tl.constexpr,
                  COUNT_CHUNK: tl.constexpr, BLOCKS: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    lo = tl.program_id(0) * CHUNK
    earlier = _expert_counts(ids_ptr, 0, lo, E_PAD, COUNT_CHUNK)
    counts = earlier + _expert_counts(ids_ptr, lo, n, E_PAD, COUNT_CHUNK)
    padded = (counts + BM - 1) // BM * BM
    pend = tl.cumsum(padded, 0)
    pstart = pend - padded
    _scatter_chunk(ids_ptr, rows_ptr, n, lo, pstart + earlier, CHUNK)
    _write_blocks(rows_ptr, be_ptr, n, counts, pstart, pend, E, E_PAD, LOG_E, BM, BLOCKS)


def align_by_expert_triton(ids: torch.Tensor, num_experts: int, block_m: int,
                           chunk: int | None = None, count_chunk: int | None = None):
    """:func:`align_by_expert` in one Triton launch (no host sync; bit-equal to
    :func:`align_by_expert_torch`): ``cdiv(n, chunk)`` programs, program p placing the rows
    ``[p * chunk, (p + 1) * chunk)``. Each program

    1. counts the rows of each expert before its chunk and in all (``tl.histogram`` over all
       n ids: redundant across programs, but no program waits for another), pads the counts
       to ``block_m`` and takes the runs' starts and ends by a prefix sum over the experts;
    2. stores each of its rows at its run's start + the rows of that expert before the chunk
       + its stable rank among the chunk's rows of that expert (a [chunk, chunk] comparison);
    3. for its share of the blocks: the block's expert by a binary search of the block start in
       the run ends (PyTorch's ``searchsorted(..., right=True)``), and ``n`` in its padding
       slots (never a slot of step 2: no ordering between programs is needed).

    The idea is the one of vLLM's ``moe_align_block_size`` (a count, a prefix sum, a scatter),
    written here anew for a stable order and no cross-program synchronisation. Each program
    reads all n ids, so the kernel's time grows with n: ``align_by_expert`` takes it up to
    ``ALIGN_KERNEL_MAX_ROWS`` rows.

    Args:
        ids: [T, k] integer expert indices in [0, num_experts) on a CUDA device (or the CPU under
            ``TRITON_INTERPRET=1``); an index outside is not checked (its row is left out and a
            slot of ``rows`` is never written).
        num_experts: E, at most ``MAX_EXPERTS`` (a compile-time constant of the kernel).
        block_m: rows per block, a power of two.
        chunk, count_chunk: rows per program and ids per step of its counting loops, powers of
            two (default: :func:`align_tiles`; the results do not depend on them).

    Returns: as :func:`align_by_expert`.

    Raises:
        ValueError: ``ids`` not 2-D or not integer, ``num_experts`` outside [1, MAX_EXPERTS],
            ``block_m``, ``chunk`` or ``count_chunk`` not a power of two.
    """
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise ValueError(f"align_by_expert takes [T, k] integer ids, got {tuple(ids.shape)} "
                         f"{ids.dtype}")
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts must be in [1, {MAX_EXPERTS}], got {num_experts}")
    n, dev = ids.numel(), ids.device
    tiles = align_tiles(n)
    chunk, count_chunk = chunk or tiles[0], count_chunk or tiles[1]
    for name, v in (("block_m", block_m), ("chunk", chunk), ("count_chunk", count_chunk)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    R = padded_rows(n, num_experts, block_m)
    # written by the kernel only: in a dry forward (kernels/compile_ahead.py) they stay
    # uninitialised, which is harmless since only the (also skipped) expert kernels read them
    rows = torch.empty(R, dtype=torch.int64, device=dev)
    block_expert = torch.empty(R // block_m, dtype=torch.int64, device=dev)
    if n:
        e_pad = max(triton.next_power_of_2(num_experts), 2)
        _align_kernel[(triton.cdiv(n, chunk),)](
            ids.contiguous(), rows, block_expert, n, E=num_experts, E_PAD=e_pad,
            LOG_E=e_pad.bit_length() - 1, BM=block_m, CHUNK=chunk,
            COUNT_CHUNK=count_chunk, BLOCKS=max(1, ALIGN_FILL // block_m),
            num_warps=ALIGN_WARPS, **pdl.launch(ids))
    return rows, block_expert


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int):
    """Sort the flat (token, choice) rows of ``ids`` [T, k] (int64 expert indices) by expert,
    each expert's run padded to a multiple of ``block_m``; rows of one expert stay in increasing
    flat order (a stable sort).

    Returns (rows [R] int64, block_expert [R // block_m] int64), R =
    ``padded_rows(T * k, num_experts, block_m)``: ``rows`` the flat index at each padded position
    (``T * k`` marks padding), ``block_expert`` each block's expert (-1: block past the last
    run); see the module docstring. On CUDA (or the CPU under ``TRITON_INTERPRET=1``) and for at
    most ``ALIGN_KERNEL_MAX_ROWS`` rows: :func:`align_by_expert_triton` (one launch); otherwise
    :func:`align_by_expert_torch` (the same outputs).

    Raises: as the path taken (ValueError for bad arguments on the Triton path).
    """
    if (ids.is_cuda or INTERPRET) and ids.numel() <= ALIGN_KERNEL_MAX_ROWS:
        return align_by_expert_triton(ids, num_experts, block_m)
    return align_by_expert_torch(ids, num_experts, block_m)


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, rows_ptr, be_ptr, act_ptr, num_rows, top_k,
                    H: tl.constexpr, I: tl.constexpr, sx, swe, swn, sa, BM: tl.constexpr,
                    BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    b = tl.program_id(0)
    e = tl.load(be_ptr + b)
    if e < 0:
        return
    offs_m = b * BM + tl.arange(0, BM)
    r = tl.load(rows_ptr + offs_m)
    valid = r < num_rows
    tok = tl.where(valid, r // top_k, 0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_ok = offs_n < I
    w_base = w_ptr + e.to(tl.int64) * swe
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, H, BK):
        offs_k = k0 + tl.arange(0, BK)
        k_ok = offs_k < H
        xa = tl.load(x_ptr + tok[:, None] * sx + offs_k[None, :],
                     mask=valid[:, None] & k_ok[None, :], other=0.0)
        wmask = k_ok[:, None] & n_ok[None, :]
        wg = tl.load(w_base + offs_n[None, :] * swn + offs_k[:, None], mask=wmask, other=0.0)
        wu = tl.load(w_base + (I + offs_n)[None, :] * swn + offs_k[:, None], mask=wmask,
                     other=0.0)
        acc_g = tl.dot(xa, wg, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(xa, wu, acc_u, input_precision=PRECISION)
    y = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(act_ptr + offs_m[:, None] * sa + offs_n[None, :], y.to(act_ptr.dtype.element_ty),
             mask=n_ok[None, :])


@triton.jit
def _down_kernel(act_ptr, w_ptr, rows_ptr, be_ptr, rw_ptr, out_ptr, num_rows,
                 H: tl.constexpr, I: tl.constexpr, sa, swe, swn, so, BM: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    b = tl.program_id(0)
    e = tl.load(be_ptr + b)
    if e < 0:
        return
    offs_m = b * BM + tl.arange(0, BM)
    r = tl.load(rows_ptr + offs_m)
    valid = r < num_rows
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_ok = offs_n < H
    w_base = w_ptr + e.to(tl.int64) * swe
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, I, BK):
        offs_k = k0 + tl.arange(0, BK)
        k_ok = offs_k < I
        a = tl.load(act_ptr + offs_m[:, None] * sa + offs_k[None, :], mask=k_ok[None, :],
                    other=0.0)
        w = tl.load(w_base + offs_n[None, :] * swn + offs_k[:, None],
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    rw = tl.load(rw_ptr + r, mask=valid, other=0.0).to(tl.float32)
    acc = acc * rw[:, None]
    tl.store(out_ptr + r[:, None] * so + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


def _block_m(num_rows: int) -> int:
    return 16 if num_rows <= 64 else 64


@dataclass(frozen=True)
class MoETiles:
    """Output-column and reduction tile sizes of the two expert kernels, their warps, and the
    software pipeline's depth (``num_stages``: loads in flight per program; None: Triton's
    default)."""

    gate_up_n: int = 64
    gate_up_k: int = 64
    down_n: int = 64
    down_k: int = 64
    num_warps: int = 4
    num_stages: int | None = None

    def launch(self) -> dict:
        """The launch options these tiles set (``num_warps``, and ``num_stages`` if given)."""
        opts = {"num_warps": self.num_warps}
        if self.num_stages is not None:
            opts["num_stages"] = self.num_stages
        return opts


def moe_tiles(num_rows: int) -> MoETiles:
    """Tiles for ``num_rows`` (token, choice) rows, from ``benchmarks/gpu_moe.py`` on the H200
    (64 experts, top 8, H 2048, I 512, bf16; 2026-12-01): narrower gate/up tiles everywhere
    (more programs for the few experts a step touches); one token: long reductions, 27.4 ->
    19.1 us per layer; 4 tokens (a k = 3 verify): 50.1 -> 47.7 us; 16 / 64 tokens:
    156.6 -> 146.0 / 189.2 -> 181.4 us."""
    if num_rows <= 8:
        return MoETiles(32, 256, 128, 128)
    if num_rows <= ONE_ROW_BLOCKS:
        return MoETiles(32, 64, 64, 128)
    return MoETiles(32, 64, 128, 64)


# at most this many (token, choice) rows (decode and verify steps) skip the sort by expert.
# Measured and dropped (session 30, 85e9b63): a verify step's rows routed to one expert
# gathered into one block, so each expert's weights are read once (4 tokens, top 8 of 64:
# 26.5 distinct experts for 32 rows); the 4-token forward took 1.680 ms against 1.676
# without (L2 already serves the rows' repeated reads). Also dropped (session 30, 9502471):
# a down product that summed each token's choices and added the shared expert itself (one
# program per 16 outputs reading the k experts in turn, on CUDA cores): the hybrid's
# one-token forward took 1.222 ms against 1.152 with the sum and addcmul in PyTorch. Also
# dropped (session 35, removed after 5fb7fd1): streamed one-row expert products (units of a
# row block by a chunk of inputs, CUDA-core float32, a register double buffer; session 34) lost
# to these tiles on an H100: 22.6 against 23.0 us a layer at one token, 75.7 against 71.9 at
# four (benchmarks/gpu_moe.py), the one-token forward 1.142 ms against 1.072-1.074
ONE_ROW_BLOCKS = 64
_one_row_rows: dict = {}


def one_row_blocks(ids: torch.Tensor, block_m: int):
    """The layout of :func:`align_by_expert` with every (token, choice) row alone in its block:
    no sort, so no kernels beyond a view of ``ids`` (decode / verify, where few rows share an
    expert anyway). Returns (rows [n * block_m] int64, block_expert [n] int64); ``rows`` depends
    only on n and is cached (not while a CUDA graph is being captured: its fill would not run)."""
    n, dev = ids.numel(), ids.device
    rows = _one_row_rows.get((n, block_m, dev))
    if rows is None:
        rows = torch.full((n, block_m), n, dtype=torch.int64, device=dev)
        rows[:, 0] = torch.arange(n, device=dev)
        rows = rows.flatten()
        if not (dev.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _one_row_rows[(n, block_m, dev)] = rows
    return rows, ids.flatten().to(torch.int64)


def fused_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                  gate_up: torch.Tensor, down: torch.Tensor,
                  tiles: MoETiles | None = None, sum_choices: bool = True,
                  num_experts: int | None = None, routed_rows: int | None = None
                  ) -> torch.Tensor:
    """Routed expert outputs, summed over each token's choices (``sum_choices``; else one row
    per (token, choice), [T * k, H] token-major, for kernels/moe_combine_triton.py).

    Args:
        x: [T, H] activations; ids: [T, k] int64 expert indices; weights: [T, k] routing weights;
        gate_up: [E, 2I, H] (gate rows, then up rows); down: [E, H, I]; all on one CUDA device
        (or CPU under ``TRITON_INTERPRET=1``), weights in x's dtype.

        tiles: the kernels' tile sizes (default: :func:`moe_tiles` of the row count).
        num_experts: the experts ``ids`` may name, for the sort by expert (default: E; fewer
            when gate_up / down hold more rows than the routing uses, layers/moe.py).
        routed_rows: the row count that picks the layout (one row a block, or sorted), the
            block and the tiles (default: T * k; a folded shared expert's extra choice is not
            counted, so a step takes the layout of its routed rows).

    Returns:
        [T, H] in x's dtype: ``sum_c w[t, c] * down_e(silu(gate_e x_t) * up_e x_t)``,
        ``e = ids[t, c]``.
    """
    T, k = ids.shape
    ids = ids.contiguous()   # a [T, 1] column sliced from wider ids flattens to a strided view
    rows_e, two_i, H = gate_up.shape
    E = num_experts or rows_e
    inter, n = two_i // 2, T * k
    decide = routed_rows or n
    bm = _block_m(decide)
    rows, block_expert = (one_row_blocks(ids, bm) if decide <= ONE_ROW_BLOCKS
                          else align_by_expert(ids, E, bm))
    nb = block_expert.numel()
    t = tiles or moe_tiles(decide)
    x = x.contiguous()
    act = x.new_empty(rows.numel(), inter)
    # float32 models get float32 products (tl.dot would take TF32 on Hopper)
    prec = "ieee" if x.dtype == torch.float32 else None
    _gate_up_kernel[(nb, triton.cdiv(inter, t.gate_up_n))](
        x, gate_up, rows, block_expert, act, n, k, H, inter,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0), BM=bm,
        BN=t.gate_up_n, BK=t.gate_up_k, PRECISION=prec, **t.launch(), **pdl.launch(x))
    out = x.new_empty(n, H)
    _down_kernel[(nb, triton.cdiv(H, t.down_n))](
        act, down, rows, block_expert, weights.contiguous().flatten(), out, n, H, inter,
        act.stride(0), down.stride(0), down.stride(1), out.stride(0), BM=bm, BN=t.down_n,
        BK=t.down_k, PRECISION=prec, **t.launch(), **pdl.launch(x))
    return out.view(T, k, H).sum(1) if sum_choices else out
