"""Streamed expert products for decode and verify steps (Triton): one (token, choice) row at a time.

At one token the MoE block's two expert kernels of kernels/fused_moe_triton.py run ``tl.dot``
tiles of 16 rows of which one is real, a grid of (choices x column tiles) programs that is about
one wave: on the H200 they read expert weights at 2.64 TB/s at one token and ~3.5 at four
(BENCHMARKS.md, session 30), where the dense one-row products stream theirs at up to ~3.8.

Here, as kernels/gemv_stream_triton.py does for a dense one-row product, the work is cut into
*units*: a block of ``BLOCK_N`` output columns of one (token, choice) row, times a chunk of
``BLOCK_K`` inputs. The blocks of all rows are numbered row-major; program ``p`` of ``G`` owns
blocks ``p, p + G, ...`` and goes through their units in order, with one unit in registers being
multiplied while the next one loads (a register double buffer). Each row reads its own expert's
weights (its id from ``ids``), its token's input (gate/up) or its own activation (down); rows
that share an expert read that expert's bytes again (from L2 at these sizes). Multiply and sum on
CUDA cores in float32, the chunks' sums added in order of the reduction, one rounding to the
output dtype; the bits differ from the tiled kernels' (another order of the sum), and a row's
bits do not depend on G or on the other rows.

Gate/up: a unit is ``BLOCK_N`` gate rows and the ``BLOCK_N`` matching up rows of ``[E, 2I, H]``;
``act[row, j] = silu(g_j) * u_j`` rounded to x's dtype, as the tiled kernel stores it. Down:
``out[row, n] = w[row] * (act[row] . down[e, n])``, as the tiled kernel. The caller sums over
choices (or defers the sum to the next norm).

The expert ids are the routing kernel's output, so the gate/up kernel loads no weight before
its PDL wait. The down kernel comes right after the gate/up kernel, which writes no ids and whose
every program waits (so the kernels before it, the routing among them, have finished) before it
lets the down kernel launch: with ``early_down`` the down kernel's programs read their row's
expert id and load their first unit of weights before their wait (only the activations wait),
as the dense streamed products do (kernels/pdl.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.gemv_stream_triton import sm_count, to_f32
from mtpserve.kernels.pdl import pdl_wait


@triton.jit
def _program_units(rows, BLOCKS_PER_ROW: tl.constexpr, CHUNKS: tl.constexpr):
    """This program's id ``pid``, the program count ``G`` and the units ``pid`` goes through: it
    owns blocks pid, pid + G, ... of the ``rows * BLOCKS_PER_ROW``, each ``CHUNKS`` units."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    return pid, G, ((rows * BLOCKS_PER_ROW - 1 - pid) // G + 1) * CHUNKS


@triton.jit
def _unit_rows(ids_ptr, u, pid, G, BLOCKS_PER_ROW: tl.constexpr, CHUNKS: tl.constexpr):
    """Unit ``u`` of program ``pid``: its (token, choice) row, the row's expert, its first
    output column block and its input chunk."""
    block = pid + (u // CHUNKS) * G
    row = block // BLOCKS_PER_ROW
    e = tl.load(ids_ptr + row).to(tl.int64)
    return row, e, block % BLOCKS_PER_ROW, u % CHUNKS


@triton.jit
def _unit_ptrs(w_ptr, ids_ptr, swe, swn, u, pid, G, r, c, BLOCKS_PER_ROW: tl.constexpr,
               CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_K] pointers to unit ``u``'s weights: its block's rows of its row's
    expert (gate rows of a gate/up weight, whose up rows lie ``I`` rows further), its chunk's
    inputs."""
    row, e, nb, chunk = _unit_rows(ids_ptr, u, pid, G, BLOCKS_PER_ROW, CHUNKS)
    return (w_ptr + e * swe + (nb * BLOCK_N + r)[:, None].to(tl.int64) * swn
            + (chunk * BLOCK_K + c)[None, :])


@triton.jit
def _load_gate_up(w_ptr, ids_ptr, swe, swn, u, pid, G, r, c, I: tl.constexpr,
                  BLOCKS_PER_ROW: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """Gate and up rows of unit ``u``, each [BLOCK_N, BLOCK_K] in the weight's dtype."""
    p = _unit_ptrs(w_ptr, ids_ptr, swe, swn, u, pid, G, r, c, BLOCKS_PER_ROW, CHUNKS, BLOCK_N,
                   BLOCK_K)
    return tl.load(p), tl.load(p + I * swn)


@triton.jit
def _gate_up_stream_kernel(x_ptr, w_ptr, ids_ptr, act_ptr, top_k, rows, swe, swn, sx, sa,
                           H: tl.constexpr, I: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, LATE: tl.constexpr, PDL: tl.constexpr):
    BPR: tl.constexpr = I // BLOCK_N
    CHUNKS: tl.constexpr = H // BLOCK_K
    pid, G, units = _program_units(rows, BPR, CHUNKS)
    r = tl.arange(0, BLOCK_N)
    c = tl.arange(0, BLOCK_K)
    pdl_wait(PDL)
    wg, wu = _load_gate_up(w_ptr, ids_ptr, swe, swn, 0, pid, G, r, c, I, BPR, CHUNKS,
                           BLOCK_N, BLOCK_K)
    acc_g = tl.zeros([BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_N], tl.float32)
    for u in range(0, units):
        row, e, nb, chunk = _unit_rows(ids_ptr, u, pid, G, BPR, CHUNKS)
        if u + 1 < units:
            ng, nu = _load_gate_up(w_ptr, ids_ptr, swe, swn, u + 1, pid, G, r, c, I, BPR,
                                   CHUNKS, BLOCK_N, BLOCK_K)
        else:
            ng, nu = wg, wu
        x = tl.load(x_ptr + (row // top_k) * sx + chunk * BLOCK_K + c).to(tl.float32)
        acc_g += tl.sum(to_f32(wg, LATE) * x[None, :], axis=1)
        acc_u += tl.sum(to_f32(wu, LATE) * x[None, :], axis=1)
        if chunk == CHUNKS - 1:   # the unit ended its block: SiLU(g) * u, rounded once
            y = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
            tl.store(act_ptr + row * sa + nb * BLOCK_N + r, y.to(act_ptr.dtype.element_ty))
            acc_g = tl.zeros([BLOCK_N], tl.float32)
            acc_u = tl.zeros([BLOCK_N], tl.float32)
        wg, wu = ng, nu


@triton.jit
def _down_stream_kernel(act_ptr, w_ptr, ids_ptr, rw_ptr, out_ptr, rows, swe, swn, sa, so,
                        H: tl.constexpr, I: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, EARLY: tl.constexpr, LATE: tl.constexpr,
                        PDL: tl.constexpr):
    BPR: tl.constexpr = H // BLOCK_N
    CHUNKS: tl.constexpr = I // BLOCK_K
    pid, G, units = _program_units(rows, BPR, CHUNKS)
    r = tl.arange(0, BLOCK_N)
    c = tl.arange(0, BLOCK_K)
    if EARLY:   # the ids are not the gate/up kernel's: only act waits for it (module doc)
        w = tl.load(_unit_ptrs(w_ptr, ids_ptr, swe, swn, 0, pid, G, r, c, BPR, CHUNKS,
                               BLOCK_N, BLOCK_K))
        pdl_wait(PDL)
    else:
        pdl_wait(PDL)
        w = tl.load(_unit_ptrs(w_ptr, ids_ptr, swe, swn, 0, pid, G, r, c, BPR, CHUNKS,
                               BLOCK_N, BLOCK_K))
    acc = tl.zeros([BLOCK_N], tl.float32)
    for u in range(0, units):
        row, e, nb, chunk = _unit_rows(ids_ptr, u, pid, G, BPR, CHUNKS)
        if u + 1 < units:
            w_next = tl.load(_unit_ptrs(w_ptr, ids_ptr, swe, swn, u + 1, pid, G, r, c, BPR,
                                        CHUNKS, BLOCK_N, BLOCK_K))
        else:
            w_next = w
        a = tl.load(act_ptr + row * sa + chunk * BLOCK_K + c).to(tl.float32)
        acc += tl.sum(to_f32(w, LATE) * a[None, :], axis=1)
        if chunk == CHUNKS - 1:
            acc = acc * tl.load(rw_ptr + row).to(tl.float32)
            tl.store(out_ptr + row * so + nb * BLOCK_N + r, acc.to(out_ptr.dtype.element_ty))
            acc = tl.zeros([BLOCK_N], tl.float32)
        w = w_next


def _programs(blocks: int, per_sm: int, device: torch.device) -> int:
    """One wave of at most ``per_sm`` programs an SM, balanced: every program owns the same
    number of blocks or one fewer. CPU (interpreter): 3 slots, so that programs own several
    blocks."""
    slots = per_sm * sm_count(device.index or 0) if device.type == "cuda" else 3
    waves = triton.cdiv(blocks, slots)
    return triton.cdiv(blocks, waves)


def stream_fits(h: int, inter: int, gate_up_n: int, gate_up_k: int, down_n: int,
                down_k: int) -> bool:
    """Whether the unit sizes are powers of two (Triton's ranges) that divide the widths (the
    kernels load whole units, unmasked)."""
    units = (gate_up_n, gate_up_k, down_n, down_k)
    return (all(u > 0 and u & (u - 1) == 0 for u in units)
            and not (inter % gate_up_n or h % gate_up_k or h % down_n or inter % down_k))


def streamed_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                     gate_up: torch.Tensor, down: torch.Tensor, gate_up_n: int = 16,
                     gate_up_k: int = 512, down_n: int = 16, down_k: int = 512,
                     num_warps: int = 4, per_sm: int = 2, early_down: bool = True
                     ) -> torch.Tensor:
    """One weighted output per (token, choice) row, streamed (module doc).

    Args:
        x: [T, H] activations; ids: [T, k] int64 rows of ``gate_up`` / ``down`` (expert
        indices); weights: [T, k] routing weights; gate_up: [E, 2I, H] (gate rows, then up
        rows) and down: [E, H, I], contiguous along their last dim; all on one CUDA device (or
        CPU under ``TRITON_INTERPRET=1``), weights in x's dtype.
        gate_up and down of one dtype.
        gate_up_n x gate_up_k, down_n x down_k: the units (powers of two dividing their
        widths); per_sm: programs an SM (one wave), at least 1.
        early_down: the down kernel loads its first unit before its PDL wait (module doc).

    Returns:
        [T * k, H] in x's dtype, token-major:
        ``w[t, c] * down_e(silu(gate_e x_t) * up_e x_t)``, ``e = ids[t, c]``.

    Raises:
        ValueError: units that are not powers of two dividing H and I, per_sm below 1, weights
        not contiguous along H / I or of two dtypes, x not [T, H], weights not [T, k].
    """
    T, k = ids.shape
    _, two_i, H = gate_up.shape
    inter, n = two_i // 2, T * k
    if not stream_fits(H, inter, gate_up_n, gate_up_k, down_n, down_k) or per_sm < 1:
        raise ValueError(f"streamed_experts: units {gate_up_n}x{gate_up_k} / {down_n}x{down_k} "
                         f"are not powers of two dividing H {H}, I {inter} (or per_sm "
                         f"{per_sm} < 1)")
    if gate_up.stride(2) != 1 or down.stride(2) != 1 or gate_up.dtype != down.dtype:
        raise ValueError("streamed_experts needs expert weights of one dtype, contiguous along "
                         "their inputs")
    if x.shape != (T, H) or weights.shape != (T, k):
        raise ValueError(f"streamed_experts: x {tuple(x.shape)} and weights "
                         f"{tuple(weights.shape)} do not fit ids {tuple(ids.shape)}, H {H}")
    if n == 0:
        return x.new_empty(0, H)
    x, flat = x.contiguous(), ids.contiguous().flatten()
    late = x.is_cuda and gate_up.dtype == torch.bfloat16
    act = x.new_empty(n, inter)
    blocks = n * (inter // gate_up_n)
    _gate_up_stream_kernel[(_programs(blocks, per_sm, x.device),)](
        x, gate_up, flat, act, k, n, gate_up.stride(0), gate_up.stride(1), x.stride(0),
        act.stride(0), H=H, I=inter, BLOCK_N=gate_up_n, BLOCK_K=gate_up_k, LATE=late,
        num_warps=num_warps, **pdl.launch(x))
    out = x.new_empty(n, H)
    blocks = n * (H // down_n)
    _down_stream_kernel[(_programs(blocks, per_sm, x.device),)](
        act, down, flat, weights.contiguous().flatten(), out, n, down.stride(0), down.stride(1),
        act.stride(0), out.stride(0), H=H, I=inter, BLOCK_N=down_n, BLOCK_K=down_k,
        EARLY=early_down, LATE=late, num_warps=num_warps, **pdl.launch(x))
    return out
