"""What a dependency between two phases costs on the GPU: a kernel boundary (with and without
PDL) against a persistent kernel whose programs signal each other through memory.

A batch-1 decode step is a chain of ~10 dependent kernels per layer; each boundary costs the
wait for the previous grid and the ramp of the next (BENCHMARKS.md, sessions 17-21). A
persistent kernel replaces boundaries with signals in memory; session 21's grid barrier cost
~3 us, but it polled with atomics on the one counter its arrivals also add to. This times one
boundary on its own, with no weights: ``G`` programs per phase, each reads a value another
program wrote in the phase before (from L2), optionally busy-waits ``--work`` ns, and writes its
own. Modes:

- ``pdl`` / ``plain``: one kernel launch per phase, with programmatic dependent launch or in plain
  stream order, all phases in one CUDA graph;
- ``atomic_poll``: one persistent kernel; a phase ends with every program adding one to the
  phase's counter and polling it with atomic adds of zero (session 21's barrier);
- ``load_poll``: the same arrivals, polled with plain volatile loads;
- ``flags``: each program sets its own flag, and waits reading all ``G`` flags with loads.

The cost of one phase is (time of ``--phases`` phases - time of a quarter as many) / the
difference, from CUDA-graph replays timed with CUDA events: launch and set-up cancel out.
Writes a table and ``--json``.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

MODES = ("plain", "pdl", "atomic_poll", "load_poll", "flags")


@triton.jit
def _now():
    """The GPU's global nanosecond timer."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _work(ns):
    """Busy-wait ``ns`` nanoseconds (nothing for 0)."""
    if ns > 0:
        t0 = _now()
        while _now() - t0 < ns:
            pass


@triton.jit
def _step(src, dst, pid, G, work_ns):
    """One phase's work: read another program's value from ``src``, wait, write ``dst[pid]``."""
    v = tl.load(src + (pid * 7 + 1) % G, cache_modifier=".cg")
    _work(work_ns)
    tl.store(dst + pid, v + 1)


@triton.jit
def _phase_kernel(src, dst, G, work_ns, PDL: tl.constexpr):
    pid = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    _step(src, dst, pid, G, work_ns)


@triton.jit
def _fence():
    tl.inline_asm_elementwise("fence.acq_rel.gpu; // $0", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _persistent_kernel(buf, sync, flags, G, phases, work_ns, MODE: tl.constexpr,
                       G_PAD: tl.constexpr):
    pid = tl.program_id(0)
    lanes = tl.arange(0, G_PAD)
    for i in range(phases):
        _step(buf + (i % 2) * G, buf + ((i + 1) % 2) * G, pid, G, work_ns)
        _fence()
        tl.debug_barrier()
        if MODE == 0:   # one counter, polled with atomics (kernels/grid_barrier.py of ee87268)
            seen = tl.atomic_add(sync + i, 1, sem="acq_rel", scope="gpu") + 1
            while seen < G:
                seen = tl.atomic_add(sync + i, 0, sem="acquire", scope="gpu")
        elif MODE == 1:   # one counter, polled with loads
            tl.atomic_add(sync + i, 1, sem="release", scope="gpu")
            while tl.load(sync + i, volatile=True) < G:
                pass
        else:   # a flag per program, all of them read with loads
            tl.store(flags + i * G + pid, 1)
            while tl.sum(tl.load(flags + i * G + lanes, mask=lanes < G, other=0,
                                 volatile=True)) < G:
                pass
        _fence()
        tl.debug_barrier()


def phases_graph(mode: str, G: int, phases: int, work_ns: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph running ``phases`` dependent phases of ``G`` programs in ``mode``."""
    buf = torch.zeros(2, G, dtype=torch.int32, device="cuda")
    sync = torch.zeros(phases, dtype=torch.int32, device="cuda")
    flags = torch.zeros(phases, G, dtype=torch.int32, device="cuda")

    def run():
        if mode in ("plain", "pdl"):
            for i in range(phases):
                _phase_kernel[(G,)](buf[i % 2], buf[(i + 1) % 2], G, work_ns,
                                    PDL=mode == "pdl", launch_pdl=mode == "pdl")
        else:
            sync.zero_()
            flags.zero_()
            _persistent_kernel[(G,)](buf, sync, flags, G, phases, work_ns,
                                     MODE=MODES.index(mode) - 2,
                                     G_PAD=triton.next_power_of_2(G))

    graph = captured(run, (buf, sync, flags))
    # every phase ran: each value went up by one per phase
    assert int(buf.max()) >= phases - 1, (mode, int(buf.max()))
    return graph


def captured(run, keep: tuple) -> torch.cuda.CUDAGraph:
    """``run()`` once eagerly (compiles), then captured in a CUDA graph and replayed once; the
    graph holds ``keep`` (the tensors it reads and writes) as ``graph.keep``."""
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    graph.keep = keep
    return graph


def replay_us(graph: torch.cuda.CUDAGraph, reps: int = 200) -> float:
    """Median microseconds of one replay over ``reps`` timed replays."""
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]


def added_us(graph_of, phases: int) -> float:
    """Microseconds one more phase adds: (replay of ``graph_of(phases)`` - replay of
    ``graph_of(phases // 4)``) / the difference in phases (see the module doc)."""
    short = max(1, phases // 4)
    return (replay_us(graph_of(phases)) - replay_us(graph_of(short))) / (phases - short)


def phase_cost_us(mode: str, G: int, phases: int, work_ns: int) -> float:
    """Microseconds one more phase adds in ``mode``."""
    return added_us(lambda p: phases_graph(mode, G, p, work_ns), phases)


# --- a chain of matrix-vector products: what a persistent kernel could gain on real bytes ---
MATVEC_MODES = ("pdl", "pdl_preload", "persistent", "persistent_preload")


@triton.jit
def _matvec_rows(w, x_ptr, y_ptr, rows, k):
    """``y[rows] = w @ x`` for a [R, H] tile ``w`` already loaded (float32 sums, bf16 out)."""
    x = tl.load(x_ptr + k, cache_modifier=".cg").to(tl.float32)
    y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty))


@triton.jit
def _matvec_kernel(w_ptr, x_ptr, y_ptr, H: tl.constexpr, R: tl.constexpr,
                   PRELOAD: tl.constexpr):
    """One product of a PDL chain: program p computes rows p*R.. of y = W x; with PRELOAD its
    weight tile is loaded before the wait for the product before (weights never depend on it)."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    k = tl.arange(0, H)
    if PRELOAD:
        w = tl.load(w_ptr + rows[:, None] * H + k[None, :])
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    else:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
        w = tl.load(w_ptr + rows[:, None] * H + k[None, :])
    _matvec_rows(w, x_ptr, y_ptr, rows, k)


@triton.jit
def _matvec_persistent_kernel(w_ptr, xs_ptr, flags, phases, num_w, H: tl.constexpr,
                              R: tl.constexpr, G: tl.constexpr, PRELOAD: tl.constexpr):
    """The same chain in one kernel of G programs: after phase i each program sets its flag, and
    phase i + 1 reads x once all G flags of phase i are set; with PRELOAD each program loads its
    next weight tile before it waits."""
    pid = tl.program_id(0)
    rows = pid * R + tl.arange(0, R)
    k = tl.arange(0, H)
    lanes = tl.arange(0, G)
    for i in range(phases):
        tile = w_ptr + (i % num_w).to(tl.int64) * H * H + rows[:, None] * H + k[None, :]
        if PRELOAD:
            w = tl.load(tile)
        if i > 0:
            while tl.sum(tl.load(flags + (i - 1) * G + lanes, volatile=True)) < G:
                pass
            _fence()
            tl.debug_barrier()
        if not PRELOAD:
            w = tl.load(tile)
        _matvec_rows(w, xs_ptr + (i % 2) * H, xs_ptr + ((i + 1) % 2) * H, rows, k)
        _fence()
        tl.debug_barrier()
        tl.store(flags + i * G + pid, 1)


def matvec_graph(mode: str, H: int, G: int, phases: int, num_w: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``phases`` dependent [H, H] bf16 products (``num_w`` weights in turn, so
    that they come from HBM), G programs each, in ``mode`` (MATVEC_MODES)."""
    R = H // G
    w = torch.randn(num_w, H, H, device="cuda", dtype=torch.bfloat16) * H ** -0.5
    xs = torch.randn(2, H, device="cuda", dtype=torch.bfloat16)
    flags = torch.zeros(phases, G, dtype=torch.int32, device="cuda")
    preload = mode.endswith("preload")

    def run():
        if mode.startswith("pdl"):
            for i in range(phases):
                _matvec_kernel[(G,)](w[i % num_w], xs[i % 2], xs[(i + 1) % 2], H=H, R=R,
                                     PRELOAD=preload, num_warps=8, launch_pdl=True)
        else:
            flags.zero_()
            _matvec_persistent_kernel[(G,)](w, xs, flags, phases, num_w, H=H, R=R, G=G,
                                            PRELOAD=preload, num_warps=8)

    return captured(run, (w, xs, flags))


def matvec_phase_us(mode: str, H: int, G: int, phases: int, num_w: int) -> float:
    """Microseconds one more product adds in ``mode``."""
    return added_us(lambda p: matvec_graph(mode, H, G, p, num_w), phases)


def check_matvec(H: int, G: int) -> float:
    """Largest difference between the persistent chain's and the PDL chain's output after 8
    products, relative to its size (they sum in the same order: expect 0)."""
    outs = []
    for mode in ("pdl", "persistent_preload"):
        torch.manual_seed(0)
        g = matvec_graph(mode, H, G, 8, 4)
        outs.append(g.keep[1][0].float().clone())   # replayed twice: 16 products, even
    return float((outs[0] - outs[1]).abs().max() / outs[0].abs().max())


def matvec_main(a) -> list[dict]:
    print(f"products of [{a.hidden}, {a.hidden}] bf16 ({a.hidden ** 2 * 2 / 1e6:.1f} MB, "
          f"{a.num_weights} weights in turn): microseconds one more product adds; "
          f"persistent vs PDL outputs differ by {check_matvec(a.hidden, 128):.2e}")
    print(f"{'programs':>9}" + "".join(f"{m:>20}" for m in MATVEC_MODES))
    rows = []
    for G in (128, 64):
        row = {m: matvec_phase_us(m, a.hidden, G, a.phases, a.num_weights)
               for m in MATVEC_MODES}
        rows.append(dict(programs=G, hidden=a.hidden, **row))
        print(f"{G:9}" + "".join(f"{row[m]:20.3f}" for m in MATVEC_MODES))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, nargs="*", default=[132, 264],
                    help="programs per phase (a persistent kernel's must all fit at once); "
                         "none: no phase table")
    ap.add_argument("--work", type=int, nargs="+", default=[0, 2000],
                    help="busy nanoseconds per program per phase")
    ap.add_argument("--phases", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--matvec", action="store_true",
                    help="also a chain of [hidden, hidden] products (MATVEC_MODES)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--num-weights", type=int, default=16,
                    help="distinct weights the chain cycles through (their bytes past the L2)")
    ap.add_argument("--json")
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}: microseconds one phase adds")
    if a.programs:
        print(f"{'programs':>9}{'work ns':>9}" + "".join(f"{m:>13}" for m in a.modes))
    rows = []
    for G in a.programs:
        for work in a.work:
            row = {m: phase_cost_us(m, G, a.phases, work) for m in a.modes}
            rows.append(dict(programs=G, work_ns=work, **row))
            print(f"{G:9}{work:9}" + "".join(f"{row[m]:13.3f}" for m in a.modes))
    if a.matvec:
        rows += matvec_main(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
