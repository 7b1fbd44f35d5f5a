"""The SwiGLU MLP of a few rows in one persistent Triton kernel: gate/up product with SiLU-and-mul,
a grid-wide barrier, down product.

At batch 1 the MLP is three kernels (gate/up product with its SwiGLU epilogue or SiLU-and-mul
apart, then the down product), and each product pays a fixed ~3.7 us on the H200 over its bytes
(first loads after the previous kernel ends, pipeline fill, tail; BENCHMARKS.md, session 19).
Here one launch of ``PROGRAMS_PER_SM`` programs per SM runs

1. phase A: the gate/up tiles of the interleaved weight (``LlamaMLP`` reorders its rows at load:
   row 2j gate j, row 2j + 1 up j), each program a tile at a time, writing ``h = silu(g) * u``
   [M, I] (``gemv_triton.store_swiglu``);
2. optionally an L2 prefetch of the program's down-weight tile (``PREFETCH``), so that HBM
   streams it while the last gate/up tiles finish and the barrier waits;
3. a barrier over every program (kernels/grid_barrier.py);
4. phase B: the down product's (tile, reduction part) items over ``h``, stored as float32
   split-K partials [S, M, N] for the next residual add + RMSNorm to sum
   (``gemv_triton.SplitKPartials``).

Tiles and splits (:func:`plan`) are chosen so that each phase's items fill the programs evenly.
Each tile runs ``gemv_triton.tile_dot`` in the order the skinny product does, so the output is
the bits of ``gemv(x, w_gate_up, swiglu=True, ...)`` then ``gemv(h, w_down, defer_sum=True,
...)`` with the same tiles. This is the persistent ("megakernel") direction of Spector et al.,
"Look Ma, No Bubbles!" (Hazy Research, 2025), for one MLP; the barrier needs every program
resident at once, which two programs of 4 warps per SM are on Hopper (registers <= 255 a thread,
shared memory <= 113 KiB a program). Under Triton's CPU interpreter the phases run as two
launches (it runs programs one after another).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from mtpserve.kernels import compile_ahead, grid_barrier, pdl
from mtpserve.kernels.dispatch import INTERPRET
from mtpserve.kernels.gemv_triton import (MAX_ROWS, SplitKPartials, store_swiglu, tile_config,
                                          tile_dot)
from mtpserve.kernels.grid_barrier import grid_leave, grid_sync
from mtpserve.kernels.jit_options import unspecialized

# off: LlamaMLP runs the gate/up product and the down product as separate kernels
# (benchmarks/gpu_decode.py --compare no_persistent_mlp)
ENABLED = False
# on: phase A in the skinny product's own gate/up tiles (tile_config), one a program, where
# the GPU holds that many programs at once (at most MAX_PER_SM a SM); otherwise (or off)
# PROGRAMS_PER_SM programs a SM, each several tiles (:func:`plan`)
ONE_ROUND = True
MAX_PER_SM = 4
PROGRAMS_PER_SM = 2
# pipeline depth of both phases' loads (one less is tried where the programs would not fit)
STAGES = 4
# L2 prefetch of each program's down-weight tile: 0 none, 1 before phase A, 2 after it (on the
# H200 both cost: 1.7B batch-1 step +44 us with 2, BENCHMARKS.md session 21)
PREFETCH = 0
# on (a diagnostic): the phases as two launches under PDL instead of one with the barrier
SPLIT_LAUNCH = False
_PHASE_BOTH, _PHASE_A, _PHASE_B = 0, 1, 2
# programs under Triton's CPU interpreter (tests)
_INTERPRETER_PROGRAMS = 4
# (2I, K, N) -> (programs, tiles, stages) of the last launch for that shape (tests, benchmarks)
last_plan: dict = {}


@functools.cache
def _sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def resident_per_sm(kernel, device_index: int) -> int:
    """How many programs of the compiled ``kernel`` one SM holds at once, by its registers,
    shared memory and threads (the CUDA occupancy rules: registers allocated 8 a thread at a
    time, 1 KiB of shared memory reserved per program)."""
    from triton.runtime import driver

    props = driver.active.utils.get_device_properties(device_index)
    kernel._init_handles()
    threads = 32 * kernel.metadata.num_warps
    by_regs = props["max_num_regs"] // (triton.cdiv(max(kernel.n_regs, 1), 8) * 8 * threads)
    by_smem = (props["max_shared_mem"] + 1024) // (kernel.metadata.shared + 1024)
    return min(by_regs, by_smem, 2048 // threads, 32)


def _fill(items: int, progs: int) -> float:
    """Share of ``progs`` program-rounds that ``items`` equal work items keep busy."""
    return items / (triton.cdiv(items, progs) * progs)


@functools.cache
def plan(two_i: int, k: int, n: int, progs: int) -> dict:
    """Tiles for an MLP of ``k`` inputs, ``two_i`` interleaved gate/up rows and ``n`` outputs
    over ``progs`` programs: phase A's ``a_block_n`` rows (``a_block_k`` inputs a step) and
    phase B's ``b_block_n`` rows, ``b_block_k`` and ``b_split`` reduction parts. Picks the first
    candidate (in the order of tile_config's tuned tiles) whose items fill the programs within a
    percent of the best."""
    a = [(bn, 128 if bn > 16 else 256) for bn in (32, 16, 64)]
    a_fill = [_fill(triton.cdiv(two_i, bn), progs) for bn, _ in a]
    a_bn, a_bk = a[next(i for i, f in enumerate(a_fill) if f >= max(a_fill) - 0.01)]
    return dict(a_block_n=a_bn, a_block_k=a_bk, **_down_plan(two_i // 2, n, progs))


def _down_plan(i: int, n: int, progs: int) -> dict:
    """Phase B's tile rows and reduction split for a down weight [n, i] over ``progs``."""
    b = [(bn, s) for bn in (32, 64, 16) for s in (4, 2, 1, 3, 6, 8) if s == 1 or i // s >= 128]
    fill = [_fill(triton.cdiv(n, bn) * s, progs) for bn, s in b]
    bn, split = b[next(j for j, f in enumerate(fill) if f >= max(fill) - 0.01)]
    return dict(b_block_n=bn, b_block_k=128, b_split=split)


@functools.cache
def one_round_plan(two_i: int, k: int, n: int, sms: int) -> tuple[int, dict] | None:
    """``(programs, tiles)`` with phase A in ``gemv_triton.tile_config``'s unsplit gate/up
    tile, one per program, if that is at most MAX_PER_SM programs a SM; else None."""
    t = tile_config(two_i, k)
    items = triton.cdiv(two_i, t["block_n"])
    if t["split_k"] != 1 or items > sms * MAX_PER_SM:
        return None
    return items, dict(a_block_n=t["block_n"], a_block_k=t["block_k"],
                       **_down_plan(two_i // 2, n, items))


def fits(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> bool:
    """Whether :func:`swiglu_mlp` takes these: ENABLED, CUDA (or the interpreter), at most
    MAX_ROWS rows, 16-bit weights of x's dtype contiguous along their inputs, an even number of
    gate/up rows matching the down weight's inputs."""
    return (ENABLED and (x.is_cuda or INTERPRET) and x.dim() == 2 and x.shape[0] <= MAX_ROWS
            and w_gate_up.dtype == w_down.dtype == x.dtype and w_gate_up.shape[0] % 2 == 0
            and w_gate_up.shape[0] == 2 * w_down.shape[1] and x.shape[1] == w_gate_up.shape[1]
            and w_gate_up.stride(-1) == 1 and w_down.stride(-1) == 1)


@triton.jit(**unspecialized(ints=("M",)))
def _swiglu_mlp_kernel(x_ptr, wgu_ptr, wd_ptr, h_ptr, part_ptr, sync_ptr, M, sx,
                       K: tl.constexpr, I: tl.constexpr, N: tl.constexpr,
                       A_BLOCK_N: tl.constexpr, A_BLOCK_K: tl.constexpr,
                       B_BLOCK_N: tl.constexpr, B_BLOCK_K: tl.constexpr, B_SPLIT: tl.constexpr,
                       B_K_SPLIT: tl.constexpr, B_ITEMS: tl.constexpr,
                       PROGRAMS: tl.constexpr, ROWS: tl.constexpr,
                       STAGES: tl.constexpr, PRECISION: tl.constexpr, PHASE: tl.constexpr,
                       PREFETCH: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    m = tl.arange(0, ROWS)
    mmask = m < M
    if PREFETCH == 1:
        _prefetch_down(wd_ptr, pid, B_ITEMS, I, N, B_BLOCK_N, B_BLOCK_K, B_SPLIT, B_K_SPLIT,
                       PROGRAMS)
    if PHASE != 2:   # phase A: h = silu(g) * u, [M, I]
        for t in range(pid, tl.cdiv(2 * I, A_BLOCK_N), PROGRAMS):
            n = t * A_BLOCK_N + tl.arange(0, A_BLOCK_N)
            acc = tile_dot(x_ptr, wgu_ptr, sx, K, m, mmask, n, n < 2 * I, 0, K, K, PRECISION,
                           A_BLOCK_N, A_BLOCK_K, ROWS, STAGES, False)
            store_swiglu(acc, h_ptr, m, mmask, t, 2 * I, I, ROWS, A_BLOCK_N)
    if PREFETCH == 2:
        _prefetch_down(wd_ptr, pid, B_ITEMS, I, N, B_BLOCK_N, B_BLOCK_K, B_SPLIT, B_K_SPLIT,
                       PROGRAMS)
    if PHASE == 0:
        grid_sync(sync_ptr, PROGRAMS)
    if PDL:   # only now: the next kernel's programs must not take a slot a barrier waits for
        tl.extra.cuda.gdc_launch_dependents()
    if PHASE != 1:   # phase B: partials [B_SPLIT, M, N] of h @ w_down^T
        for t in range(pid, B_ITEMS, PROGRAMS):
            pid_n, pid_k = t // B_SPLIT, t % B_SPLIT
            n = pid_n * B_BLOCK_N + tl.arange(0, B_BLOCK_N)
            nmask = n < N
            acc = tile_dot(h_ptr, wd_ptr, I, I, m, mmask, n, nmask, pid_k * B_K_SPLIT, I,
                           B_K_SPLIT, PRECISION, B_BLOCK_N, B_BLOCK_K, ROWS, STAGES, True)
            tl.store(part_ptr + pid_k * M * N + m[:, None] * N + n[None, :], acc,
                     mask=mmask[:, None] & nmask[None, :])
    if PHASE == 0:
        grid_leave(sync_ptr, PROGRAMS)


@triton.jit
def _prefetch_down(wd_ptr, pid, b_items, I: tl.constexpr, N: tl.constexpr,
                   B_BLOCK_N: tl.constexpr, B_BLOCK_K: tl.constexpr, B_SPLIT: tl.constexpr,
                   B_K_SPLIT: tl.constexpr, PROGRAMS: tl.constexpr):
    """``prefetch.global.L2`` of every 128-byte line of this program's phase-B weight tiles."""
    LINE: tl.constexpr = 64   # 16-bit elements per 128-byte line
    for t in range(pid, b_items, PROGRAMS):
        n = (t // B_SPLIT) * B_BLOCK_N + tl.arange(0, B_BLOCK_N)
        for k0 in range(0, B_K_SPLIT, B_BLOCK_K):
            k = (t % B_SPLIT) * B_K_SPLIT + k0 + tl.arange(0, B_BLOCK_K // LINE) * LINE
            ptrs = wd_ptr + n[:, None].to(tl.int64) * I + k[None, :]
            ok = (n[:, None] < N) & (k[None, :] < I)
            tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; "
                                      "@p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
                                      "=r,l,r", [ptrs, ok.to(tl.int32)], dtype=tl.int32,
                                      is_pure=False, pack=1)


def swiglu_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
               progs: int | None = None) -> SplitKPartials:
    """``down(silu(gate(x)) * up(x))`` for ``x`` [M, K], ``M <= MAX_ROWS``, as split-K partials.

    ``w_gate_up`` [2I, K] with rows interleaved (gate j, up j; ``layers/activation.py``),
    ``w_down`` [N, I], both of x's 16-bit dtype (float32 too under the interpreter), contiguous
    along their inputs. Returns ``SplitKPartials`` of [S, M, N] float32 partials (the output in
    x's dtype is their sum in order, rounded once), bit-equal to the skinny product's with the
    tiles it ran (``last_plan``). ``progs`` sets the program count (tiles by :func:`plan`);
    by default CUDA takes :func:`one_round_plan` where its programs fit, else PROGRAMS_PER_SM
    programs a SM, and the interpreter 4. Raises ``RuntimeError`` where no plan's programs fit
    on the GPU at once.
    Raises ``ValueError`` where :func:`fits` (ENABLED aside) does not hold."""
    M, K = x.shape
    two_i, N = w_gate_up.shape[0], w_down.shape[0]
    if not (M <= MAX_ROWS and two_i % 2 == 0 and w_down.shape[1] * 2 == two_i
            and w_gate_up.shape[1] == K and w_gate_up.dtype == w_down.dtype == x.dtype
            and w_gate_up.stride(-1) == 1 and w_down.stride(-1) == 1):
        raise ValueError(f"swiglu_mlp: x {tuple(x.shape)} {x.dtype}, gate/up "
                         f"{tuple(w_gate_up.shape)} {w_gate_up.dtype}, down "
                         f"{tuple(w_down.shape)} {w_down.dtype} do not fit")
    x = x if x.stride(-1) == 1 else x.contiguous()
    if INTERPRET:   # programs run one after another: no barrier, the phases as two launches
        progs = progs or _INTERPRETER_PROGRAMS
        cfg = plan(two_i, K, N, progs)
        out, args, kw = _prepare(x, w_gate_up, w_down, progs, cfg, STAGES)
        last_plan[(two_i, K, N)] = (progs, cfg, STAGES)
        for phase in (_PHASE_A, _PHASE_B):
            _swiglu_mlp_kernel[(progs,)](*args, **kw, PHASE=phase, PREFETCH=0, PDL=False)
        return out
    for progs, cfg, stages in _candidates(two_i, K, N, x.device.index or 0, progs):
        out, args, kw = _prepare(x, w_gate_up, w_down, progs, cfg, stages)
        kw.update(PREFETCH=PREFETCH, **pdl.launch(x))
        last_plan[(two_i, K, N)] = (progs, cfg, stages)
        if SPLIT_LAUNCH:
            for phase in (_PHASE_A, _PHASE_B):
                _swiglu_mlp_kernel[(progs,)](*args, **kw, PHASE=phase)
            return out
        kw["PHASE"] = _PHASE_BOTH
        if _resident(args, kw, progs, x.device.index or 0):
            _swiglu_mlp_kernel[(progs,)](*args, **kw)
            return out
    raise RuntimeError(f"swiglu_mlp: no plan whose programs the GPU holds at once for "
                       f"{tuple(w_gate_up.shape)} / {tuple(w_down.shape)}")


def _candidates(two_i: int, k: int, n: int, device_index: int, progs: int | None):
    """``(programs, tiles, stages)`` to try in order: the one-round plan at STAGES and one
    less, then PROGRAMS_PER_SM programs a SM (``progs`` given: that many, by :func:`plan`)."""
    sms = _sms(device_index)
    one = one_round_plan(two_i, k, n, sms) if ONE_ROUND and progs is None else None
    if one is not None:
        yield one[0], one[1], STAGES
        yield one[0], one[1], STAGES - 1
    progs = progs or PROGRAMS_PER_SM * sms
    yield progs, plan(two_i, k, n, progs), STAGES


def _prepare(x, w_gate_up, w_down, progs: int, cfg: dict, stages: int):
    """The output, kernel arguments and constexprs of one launch with tiles ``cfg``."""
    M, K = x.shape
    two_i, N = w_gate_up.shape[0], w_down.shape[0]
    bk = cfg["b_block_k"]
    b_k_split = triton.cdiv(triton.cdiv(two_i // 2, cfg["b_split"]), bk) * bk
    split = triton.cdiv(two_i // 2, b_k_split)
    h = torch.empty(M, two_i // 2, dtype=x.dtype, device=x.device)
    part = torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    kw = dict(K=K, I=two_i // 2, N=N, A_BLOCK_N=cfg["a_block_n"], A_BLOCK_K=cfg["a_block_k"],
              B_BLOCK_N=cfg["b_block_n"], B_BLOCK_K=bk, B_SPLIT=split, B_K_SPLIT=b_k_split,
              B_ITEMS=triton.cdiv(N, cfg["b_block_n"]) * split, PROGRAMS=progs,
              ROWS=MAX_ROWS, STAGES=stages,
              PRECISION="ieee" if x.dtype == torch.float32 else None, num_warps=4)
    args = (x, w_gate_up, w_down, h, part, grid_barrier.counters(x.device), M, x.stride(0))
    return SplitKPartials(part, x.dtype), args, kw


_resident_known: dict = {}


def _resident(args: tuple, kw: dict, progs: int, device_index: int) -> bool:
    """Whether all ``progs`` programs of the kernel compiled for ``kw`` fit on the device at
    once (a launch with more would wait in its barrier forever); compiles it the first time.
    Inside a dry forward (kernels/compile_ahead.py) a launch only compiles: True."""
    key = (device_index, progs, tuple(sorted(kw.items())))
    if compile_ahead.dry():
        return True
    if key not in _resident_known:
        kernel = _swiglu_mlp_kernel.warmup(*args, grid=(progs,), **kw)
        _resident_known[key] = progs <= resident_per_sm(kernel, device_index) * _sms(device_index)
    return _resident_known[key]
