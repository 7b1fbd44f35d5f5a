"""Sparse-MoE expert computation as two grouped GEMMs (Triton), with no host synchronisation.

The plain-PyTorch path in ``layers/moe.py`` loops over experts on the host and reads their token
counts back (``.tolist()``): a sync and one set of kernels per active expert, which is slow on a
GPU and cannot be captured in a CUDA graph. Here, as in the grouped "fused MoE" GEMM of
MegaBlocks (Gale et al. 2023) and vLLM, the (token, choice) rows are sorted by expert and padded
so that every block of ``block_m`` rows belongs to one expert; a kernel then runs one GEMM tile
per (block, output columns), reading that expert's weights once per block:

1. :func:`align_by_expert` (torch ops only: scatter_add, argsort, cumsum, searchsorted) gives
   ``rows`` [R] int64, the flat (token * top_k + choice) index at each padded position (``T * k``
   marks padding), and ``block_expert`` [R / block_m] int64 (-1: block past the end);
2. ``_gate_up_kernel``: ``act = silu(x W_gate^T) * (x W_up^T)`` per padded row;
3. ``_down_kernel``: ``out[row] = routing_weight[row] * act W_down^T`` scattered back to the flat
   (token, choice) rows; the caller sums over the k choices.

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
from mtpserve.kernels.pdl import pdl_wait


def padded_rows(num_rows: int, num_experts: int, block_m: int) -> int:
    """Upper bound of the padded row count for ``num_rows`` (token, choice) rows."""
    bound = num_rows + min(num_rows, num_experts) * (block_m - 1)
    return triton.cdiv(bound, block_m) * block_m


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int):
    """Sort the flat (token, choice) rows of ``ids`` [T, k] (expert indices) by expert, each
    expert's run padded to a multiple of ``block_m``.

    Returns (rows [R] int64, block_expert [R // block_m] int64); see the module docstring.
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
    """Output-column and reduction tile sizes of the two expert kernels, and their warps."""

    gate_up_n: int = 64
    gate_up_k: int = 64
    down_n: int = 64
    down_k: int = 64
    num_warps: int = 4


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


# at most this many (token, choice) rows (decode and verify steps) skip the sort by expert
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
                  tiles: MoETiles | None = None) -> torch.Tensor:
    """Routed expert outputs, summed over each token's choices.

    Args:
        x: [T, H] activations; ids: [T, k] int64 expert indices; weights: [T, k] routing weights;
        gate_up: [E, 2I, H] (gate rows, then up rows); down: [E, H, I]; all on one CUDA device
        (or CPU under ``TRITON_INTERPRET=1``), weights in x's dtype.

        tiles: the kernels' tile sizes (default: :func:`moe_tiles` of the row count).

    Returns:
        [T, H] in x's dtype: ``sum_c w[t, c] * down_e(silu(gate_e x_t) * up_e x_t)``,
        ``e = ids[t, c]``.
    """
    T, k = ids.shape
    E, two_i, H = gate_up.shape
    inter, n = two_i // 2, T * k
    bm = _block_m(n)
    rows, block_expert = (one_row_blocks(ids, bm) if n <= ONE_ROW_BLOCKS
                          else align_by_expert(ids, E, bm))
    nb = block_expert.numel()
    t = tiles or moe_tiles(n)
    x = x.contiguous()
    act = x.new_empty(rows.numel(), inter)
    # float32 models get float32 products (tl.dot would take TF32 on Hopper)
    prec = "ieee" if x.dtype == torch.float32 else None
    _gate_up_kernel[(nb, triton.cdiv(inter, t.gate_up_n))](
        x, gate_up, rows, block_expert, act, n, k, H, inter,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0), BM=bm,
        BN=t.gate_up_n, BK=t.gate_up_k, PRECISION=prec, num_warps=t.num_warps,
        **pdl.launch(x))
    out = x.new_empty(n, H)
    _down_kernel[(nb, triton.cdiv(H, t.down_n))](
        act, down, rows, block_expert, weights.contiguous().flatten(), out, n, H, inter,
        act.stride(0), down.stride(0), down.stride(1), out.stride(0), BM=bm, BN=t.down_n,
        BK=t.down_k, PRECISION=prec, num_warps=t.num_warps, **pdl.launch(x))
    return out.view(T, k, H).sum(1)
