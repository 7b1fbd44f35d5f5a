"""Where a GPU step's time goes: per-kernel device time of one forward (torch.profiler, eager so
every kernel is seen) and the host-side cost of a whole engine step (cProfile, CUDA graphs on).

    python benchmarks/gpu_profile.py [--shapes qwen3-1.7b qwen3-next-3b] [--out DIR]
    python benchmarks/gpu_profile.py --spec-host 64    # real SmolLM2, n-gram on vs off

Writes, per shape, ``DIR/<shape>-kernels-q<Q>.txt`` (kernels by self device time for a forward
of Q tokens of one sequence: Q=1 decode, Q=4 verify of 3 drafts) and ``DIR/<shape>-host.txt``
(cProfile of batch-1 engine steps, sorted by own time). A summary line per forward goes to
stdout: device time of all kernels, number of kernel launches, wall time of the eager forward.
``--step-trace B`` profiles whole engine steps with CUDA graphs on and B requests decoding
(hybrid shapes: also with MTP k=3; with ``--token-map-size N`` also with MTP drafts through
the FR-Spec head over ids 0..N-1): wall ms per step, unprofiled and profiled, and the
unprofiled host's waits in read-backs (:func:`host_waits`), against the device-busy ms per
step (union of kernel intervals), so the host-bound share shows; writes
``DIR/<shape>[-mtp|-mtp-fr]-steps-b<B>.txt``, its ``-chain.txt`` (what each kernel adds to the
step's span under PDL: :func:`chain_table`), its ``-gaps.txt`` (where the device idles
waiting for the host: :func:`gap_table`) and its ``-phases.txt`` (the unprofiled host's
milliseconds by engine phase, :func:`host_phases`, and Python's garbage collections,
:func:`gc_pauses`) and its ``-calls.txt`` (the host's small torch calls by op and
calling line, benchmarks/host_calls.py); with ``--chrome-trace`` also ``-trace.json.gz``,
the timeline of 4 steps (:func:`chrome_trace`).
``--forward-trace`` profiles graph-replayed forwards of 1 and 4 tokens of one sequence (no
draft step; a hybrid shape is built with MTP so that it has the recurrent-state scratch of a
4-token forward) and writes their chain tables, ``DIR/<shape>-forward-q<Q>-chain.txt``.
``--prefill Q ...`` profiles eager prefill forwards of Q tokens of one sequence (ops by host
and device time, Python functions by own time): ``DIR/<shape>-prefill-q<Q>.txt``.
``--set MODULE:ATTR:VALUE`` sets a module constant first, as in gpu_decode.py (e.g. the 1.7B
gate/up in checkpoint order, as before session 28: ``mtpserve.kernels.gemv_triton:SWIGLU_MIN_K:4096``).
``--spec-host N`` instead times the host side of engine steps with N code-edit requests decoding
together on the real SmolLM2 (bf16), speculation off and n-gram on: milliseconds per step spent
in each engine phase (cProfile cumulative times).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import gzip
import io
import os
import pstats
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_decode import HYBRID, PROMPT, build, decode_run, first_ids_map, set_constant
from host_calls import calls_table, torch_calls
from mtpserve.config import SpeculativeConfig
from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from mtpserve.engine.sequence import Sequence
from mtpserve.sampling_params import SamplingParams

REPEATS = 20


def _one_seq_batch(eng, q: int):
    r = eng.runner
    seq = Sequence("p", list(range(2, 2 + PROMPT)), SamplingParams(), (), eng.max_model_len,
                   None, None)
    assert eng.block_manager.allocate(seq, seq.num_tokens + q)
    if r.state_cache is not None:
        seq.state_slot = r.state_cache.alloc()
    seq.num_computed_tokens = seq.num_tokens - 1
    batch, _ = r.prepare(SchedulerOutput([ScheduledSeq(seq, 1, list(range(3, 2 + q)))]))
    return batch


def _prefill_batch(eng, q: int):
    """One sequence's prefill of ``q`` prompt tokens from position 0."""
    r = eng.runner
    seq = Sequence("pf", list(range(2, 2 + q)), SamplingParams(), (), eng.max_model_len,
                   None, None)
    assert eng.block_manager.allocate(seq, q)
    if r.state_cache is not None:
        seq.state_slot = r.state_cache.alloc()
    batch, _ = r.prepare(SchedulerOutput([ScheduledSeq(seq, q, [])]))
    return batch


def _profiled_forwards(r, batch):
    """Three unmeasured eager forwards of ``batch`` on runner ``r``, then REPEATS under the
    torch profiler: (the profile, its CUDA kernel events, their device microseconds per
    forward, wall seconds per forward under the profiler)."""
    for _ in range(3):
        r.execute(batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(REPEATS):
            r.execute(batch)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / REPEATS
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return prof, kernels, sum(e.device_time for e in kernels) / REPEATS, wall


def prefill_profile(eng, q: int, path: str) -> str:
    """A prefill forward of ``q`` tokens, eager as the engine runs it: its ops by host time and
    by device time (torch.profiler) and its Python functions by own time (cProfile), written
    to ``path``; returns a summary (wall, device, launches per forward)."""
    r = eng.runner
    batch = _prefill_batch(eng, q)
    prof, kernels, dev, _ = _profiled_forwards(r, batch)
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    for _ in range(REPEATS):
        r.execute(batch)
    torch.cuda.synchronize()
    pr.disable()
    wall = (time.perf_counter() - t) / REPEATS
    avg = prof.key_averages()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(35)
    with open(path, "w") as f:
        f.write(avg.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=70))
        f.write(avg.table(sort_by="self_device_time_total", row_limit=30,
                          max_name_column_width=70))
        f.write(text.getvalue())
    return (f"prefill q={q}: wall {wall * 1e3:.2f} ms (under cProfile), kernels "
            f"{dev / 1e3:.3f} ms device, {len(kernels) / REPEATS:.0f} launches")


def kernel_table(eng, q: int, path: str) -> str:
    """Profile REPEATS eager forwards of q tokens; write the kernel table; return a summary."""
    prof, kernels, dev, wall = _profiled_forwards(eng.runner, _one_seq_batch(eng, q))
    avg = prof.key_averages()
    with open(path, "w") as f:
        f.write(avg.table(sort_by="self_device_time_total", row_limit=45, max_name_column_width=90))
    return (f"q={q}: kernels {dev / 1e3:.3f} ms device, {len(kernels) / REPEATS:.0f} launches, "
            f"eager wall {wall * 1e3:.3f} ms")


def forward_trace(eng, q: int, path: str) -> str:
    """REPEATS graph-replayed forwards of ``q`` tokens of one sequence (q = 1: decode; 4: verify
    of 3 drafts) under the profiler, on an engine with CUDA graphs: what each kernel adds to the
    forward under PDL (:func:`chain_table`) written to ``path``; returns a summary."""
    prof, kernels, dev, wall = _profiled_forwards(eng.runner, _one_seq_batch(eng, q))
    with open(path, "w") as f:
        f.write(chain_table(kernels, REPEATS))
    return (f"q={q} graphs: busy {_busy_us(kernels) / REPEATS:.1f} us, kernels "
            f"{dev / 1e3:.3f} ms device, {len(kernels) / REPEATS:.0f} launches, wall "
            f"{wall * 1e3:.3f} ms (profiled)")


def host_profile(shape: str, spec, path: str) -> None:
    eng, _ = build(shape, False, spec)
    eng.warmup()
    decode_run(eng, 1, 32)
    pr = cProfile.Profile()
    pr.enable()
    step, _ = decode_run(eng, 1, 128)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(40)
    with open(path, "w") as f:
        f.write(f"median step {step * 1e3:.3f} ms (under cProfile)\n{s.getvalue()}")
    eng.proposer = None
    eng.runner.graphs = None


def _busy_us(kernels) -> float:
    """Microseconds during which at least one kernel ran (union of the intervals)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy


def gap_table(kernels, steps: int, rows: int = 12) -> str:
    """Where the device idles: the gaps between the end of the kernels so far and the start of
    the next, by (kernel before, kernel after), largest total first (microseconds per step,
    gaps per step). A gap is time the device waited for the host to launch work."""
    ks = sorted(kernels, key=lambda e: e.time_range.start)
    gaps: dict[tuple, float] = {}
    count: dict[tuple, int] = {}
    end, before = float("-inf"), ""
    for e in ks:
        name = _short(e.name)
        if e.time_range.start > end > float("-inf"):
            key = (before, name)
            gaps[key] = gaps.get(key, 0.0) + e.time_range.start - end
            count[key] = count.get(key, 0) + 1
        if e.time_range.end > end:
            end, before = e.time_range.end, name
    total = sum(gaps.values()) / steps
    out = [f"device idle between kernels: {total:.1f} us per step, by (before, after)",
           f"{'us/step':>9} {'n/step':>7}  kernel after <- kernel before"]
    for (b, a), us in sorted(gaps.items(), key=lambda kv: -kv[1])[:rows]:
        out.append(f"{us / steps:9.1f} {count[(b, a)] / steps:7.1f}  {a} <- {b}")
    return "\n".join(out) + "\n"


def chain_table(kernels, steps: int) -> str:
    """What each kernel adds to the step's span, by kernel and its two predecessors' names.

    Under PDL a kernel launches while its predecessor runs and spins in its wait, so its own
    duration overstates its cost; what it adds is ``end - max(previous end, start)``: from the
    later of its predecessor's end and its own start to its own end. These sum to the union of
    the kernels' intervals (the device-busy time). Keying by the two kernels before tells the
    products apart (q/k/v after a norm after the down product, gate/up after a norm after the o
    product...). Rows: microseconds per step, launches per step, microseconds per launch."""
    ks = sorted(kernels, key=lambda e: e.time_range.end)
    added: dict[tuple, float] = {}
    count: dict[tuple, int] = {}
    names = ["", ""]
    prev_end = float("-inf")
    for e in ks:
        name = _short(e.name)
        key = (names[-2], names[-1], name)
        added[key] = added.get(key, 0.0) + e.time_range.end - max(prev_end, e.time_range.start)
        count[key] = count.get(key, 0) + 1
        prev_end = max(prev_end, e.time_range.end)
        names.append(name)
    rows = sorted(added.items(), key=lambda kv: -kv[1])
    total = sum(added.values()) / steps
    out = [f"added to the step's span: {total:.1f} us per step, by (before-before, before, kernel)",
           f"{'us/step':>9} {'n/step':>7} {'us/launch':>9}  kernel <- before <- before-before"]
    for (p2, p1, name), us in rows:
        n = count[(p2, p1, name)] / steps
        out.append(f"{us / steps:9.1f} {n:7.1f} {us / steps / n:9.2f}  {name} <- {p1} <- {p2}")
    return "\n".join(out) + "\n"


def _short(name: str) -> str:
    """A kernel name cut to what tells it apart (cuBLAS / CUTLASS names run to hundreds)."""
    return name if len(name) <= 48 else name[:45] + "..."


def _timed(fn, totals: dict[str, float], key: str):
    """``fn`` wrapped to add the wall seconds of each call to ``totals[key]``."""
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0.0) + time.perf_counter() - t
    return wrapper


@contextlib.contextmanager
def host_waits():
    """Count the seconds the host spends in ``torch.cuda.Event.synchronize`` and in
    ``Tensor.tolist`` (the engine's read-backs wait there): yields a dict whose "waits" holds
    the seconds, filled as the body runs."""
    totals = {"waits": 0.0}
    sync, tolist = torch.cuda.Event.synchronize, torch.Tensor.tolist
    torch.cuda.Event.synchronize = _timed(sync, totals, "waits")
    torch.Tensor.tolist = _timed(tolist, totals, "waits")
    try:
        yield totals
    finally:
        torch.cuda.Event.synchronize, torch.Tensor.tolist = sync, tolist


@contextlib.contextmanager
def gc_pauses():
    """Count Python's garbage collections while the body runs: yields a dict generation ->
    [collections, seconds], filled through ``gc.callbacks``."""
    seen: dict[int, list] = {}
    started = [0.0]

    def callback(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            row = seen.setdefault(info["generation"], [0, 0.0])
            row[0] += 1
            row[1] += time.perf_counter() - started[0]

    gc.callbacks.append(callback)
    try:
        yield seen
    finally:
        gc.callbacks.remove(callback)


HOST_PHASES = (("", ("step", "_sync_step", "_verify", "_postprocess", "_record_for_policy")),
               ("scheduler", ("schedule",)), ("runner", ("prepare", "execute")),
               ("proposer", ("propose", "patch_inputs", "resolve_drafts", "verify_ahead",
                             "observe", "_forward")),
               ("proposer.chain", ("run_variants", "run")),
               ("runner.graphs", ("run", "_fill_full", "_fill_padded")),
               ("proposer.runner", ("prepare", "execute")),
               ("proposer.chain.graphs", ("run_variants",)),
               ("stats_logger", ("step",)), ("step_timer", ("record",)))


@contextlib.contextmanager
def host_phases(eng):
    """Time, unprofiled, the engine's phases (``HOST_PHASES``: attribute path from the engine,
    method names) by wrapping them on their instances with ``time.perf_counter``; yields a dict
    "path.method" -> seconds, inclusive of what they call, filled as the body runs."""
    totals: dict[str, float] = {}
    undo = []
    for path, names in HOST_PHASES:
        obj = eng
        for part in filter(None, path.split(".")):
            obj = getattr(obj, part, None)
        for name in names:
            fn = getattr(obj, name, None) if obj is not None else None
            if fn is None:
                continue
            setattr(obj, name, _timed(fn, totals, f"{path}.{name}".lstrip(".")))
            undo.append((obj, name))
    try:
        yield totals
    finally:
        for obj, name in undo:
            delattr(obj, name)


def step_trace_specs(map_size: int | None, tmp: Path) -> list[tuple[str, object]]:
    """(file tag, speculative config) of the step traces: plain, MTP k=3, and with ``map_size``
    MTP k=3 through the FR-Spec head over ids 0..map_size-1 (its token map written in ``tmp``)."""
    out = [("", None), ("-mtp", SpeculativeConfig(algorithm="nextn", num_steps=3,
                                                    adaptive=False))]
    if map_size:
        out.append(("-mtp-fr", SpeculativeConfig(algorithm="nextn", num_steps=3, adaptive=False,
                                                 token_map=first_ids_map(map_size, tmp))))
    return out


def chrome_trace(eng, path: str, steps: int = 4) -> None:
    """Profile ``steps`` more engine steps and write their timeline (Python functions, host
    calls, copies, graph launches and kernels, microsecond timestamps) as a gzipped Chrome
    trace, ``path``. The Python tracer slows the host several times over: read the order of
    things, not the host's durations."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 with_stack=True) as prof:
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        raw = f"{d}/trace.json"
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
            dst.write(src.read())


def step_trace(shape: str, n_req: int, path: str, spec=None, steps: int = 30,
               timeline: bool = False) -> str:
    """Profile ``steps`` engine steps of ``n_req`` greedy requests (graphs on; see module doc);
    with ``timeline`` also write 4 more steps' Chrome trace (:func:`chrome_trace`)."""
    eng, _ = build(shape, False, spec)
    eng.warmup()
    p = SamplingParams(max_tokens=6 * steps + 20, temperature=0.0, ignore_eos=True)
    for i in range(n_req):
        eng.add_request(f"t{i}", [(7 * i + j) % 1000 + 2 for j in range(PROMPT)], p)
    while eng.scheduler.waiting or any(x.in_prefill for x in eng.scheduler.running):
        eng.step()
    for _ in range(5):
        eng.step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    torch.cuda.synchronize()
    wall_plain = (time.perf_counter() - t) / steps
    with host_waits() as waited, host_phases(eng) as phases, gc_pauses() as pauses:
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
    with open(path.replace(".txt", "-phases.txt"), "w") as f:
        f.write("unprofiled host ms per step, inclusive, by engine phase\n")
        f.write(f"{'waits in read-backs':>36} {waited['waits'] / steps * 1e3:8.3f}\n")
        for gen, (n, sec) in sorted(pauses.items()):
            f.write(f"{f'garbage collections, gen {gen} ({n})':>36} {sec / steps * 1e3:8.3f}\n")
        for key, sec in sorted(phases.items(), key=lambda kv: -kv[1]):
            f.write(f"{key:>36} {sec / steps * 1e3:8.3f}\n")
    with torch_calls() as calls:
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
    with open(path.replace(".txt", "-calls.txt"), "w") as f:
        f.write(calls_table(calls, steps))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / steps
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = _busy_us(kernels) / steps
    with open(path, "w") as f:
        f.write(prof.key_averages().table(sort_by="self_device_time_total", row_limit=50,
                                          max_name_column_width=90))
    with open(path.replace(".txt", "-chain.txt"), "w") as f:
        f.write(chain_table(kernels, steps))
    with open(path.replace(".txt", "-gaps.txt"), "w") as f:
        f.write(gap_table(kernels, steps))
    if timeline:
        chrome_trace(eng, path.replace(".txt", "-trace.json.gz"))
    host = _phase_ms(eng, steps, path.replace(".txt", "-host.txt"))
    # every figure above is per step of n_req running requests: none may have ended (random
    # weights accept ~no drafts; a model that accepts many would run out of max_tokens)
    if len(eng.scheduler.running) != n_req:
        raise RuntimeError(f"{n_req - len(eng.scheduler.running)} requests ended inside the "
                           "measured steps; raise max_tokens")
    eng.proposer = None
    eng.runner.graphs = None
    label = "" if spec is None else " nextn k=3" + (" FR-Spec" if spec.token_map else "")
    return (f"{shape} b{n_req}{label}: {wall_plain * 1e3:.3f} ms/step wall ({wall * 1e3:.3f} "
            f"profiled; the host waited {waited['waits'] / steps * 1e3:.3f} ms/step in read-backs, "
            f"unprofiled), device busy {busy / 1e3:.3f} ms/step, "
            f"{len(kernels) / steps:.0f} kernels/step; cProfile ms/step: "
            + ", ".join(f"{k} {v:.3f}" for k, v in host.items()))


def _phase_ms(eng, steps: int, path: str) -> dict[str, float]:
    """Cumulative cProfile milliseconds per engine step of each of ``PHASES`` over ``steps``
    more steps (those that ran); the 60 functions of most own time written to ``path``."""
    pr = cProfile.Profile()
    for _ in range(steps):
        pr.enable()
        eng.step()
        pr.disable()
    with open(path, "w") as f:
        pstats.Stats(pr, stream=f).sort_stats("tottime").print_stats(60)
    return _per_step_ms(pr, steps)


def _per_step_ms(pr: cProfile.Profile, steps: int) -> dict[str, float]:
    """Cumulative milliseconds per step of each of our ``PHASES`` in profile ``pr``."""
    return {name: ct / steps * 1e3 for (f, _, name), (_, _, _, ct, _)
            in pstats.Stats(pr).stats.items() if name in PHASES and "mtpserve" in f}


PHASES = ("step", "propose", "draft", "schedule", "prepare", "execute", "_verify", "_sample",
          "observe", "_postprocess", "_record_for_policy")


def spec_host(conc: int, max_tokens: int = 96) -> None:
    """Per-phase host milliseconds per decode step, n-gram off and on (see the module doc)."""
    from mtpserve import LLM
    from mtpserve.bench.prompts import prompt_set

    for algo in (None, "ngram"):
        kw = dict(speculative_algorithm=algo, speculative_num_steps=4) if algo else {}
        llm = LLM(None, dtype="bfloat16", max_model_len=2048, **kw)
        tok, eng = llm.tokenizer, llm.engine
        prompts = [list(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=True,
                                                add_generation_prompt=True, return_dict=False))
                   for t in prompt_set("code-edit")]
        p = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        llm.generate(prompts[:conc], p)                     # warm-up
        for i in range(conc):
            eng.add_request(f"h{i}", prompts[i % len(prompts)], p)
        while eng.scheduler.waiting or any(x.in_prefill for x in eng.scheduler.running):
            eng.step()
        pr, n, t = cProfile.Profile(), 0, time.perf_counter()
        while eng.has_unfinished_requests():
            pr.enable()
            eng.step()
            pr.disable()
            n += 1
        wall = (time.perf_counter() - t) / n
        parts = _per_step_ms(pr, n)
        print(f"{algo or 'off':6} c={conc}: {n} steps, {wall * 1e3:.3f} ms/step wall; "
              + ", ".join(f"{k} {parts[k]:.3f}" for k in PHASES if k in parts), flush=True)
        del llm, eng
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["qwen3-1.7b", "qwen3-next-3b"])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--spec-host", type=int, metavar="N",
                    help="host time per engine phase with N requests, n-gram off and on")
    ap.add_argument("--step-trace", type=int, metavar="B",
                    help="profile whole engine steps with B requests (graphs on)")
    ap.add_argument("--forward-trace", action="store_true",
                    help="graph-replayed forwards of 1 and 4 tokens: what each kernel adds")
    ap.add_argument("--chrome-trace", action="store_true",
                    help="--step-trace: also a gzipped Chrome trace of 4 steps (-trace.json.gz)")
    ap.add_argument("--token-map-size", type=int, metavar="N",
                    help="--step-trace: hybrid shapes also with MTP drafts through the FR-Spec "
                         "head over ids 0..N-1 (files <shape>-mtp-fr-steps-b<B>*)")
    ap.add_argument("--prefill", type=int, nargs="+", metavar="Q",
                    help="profile eager prefill forwards of Q tokens of one sequence")
    ap.add_argument("--set", nargs="+", default=[], metavar="MODULE:ATTR:VALUE",
                    help="set a module constant before the engines are built (as gpu_decode.py)")
    a = ap.parse_args()
    for spec in a.set:
        set_constant(spec)
    if a.prefill:
        for shape in a.shapes:
            eng, _ = build(shape, True, None)
            for q in a.prefill:
                print(shape, prefill_profile(eng, q, f"{a.out}/{shape}-prefill-q{q}.txt"),
                      flush=True)
            del eng
            torch.cuda.empty_cache()
        return
    if a.step_trace:
        with tempfile.TemporaryDirectory() as d:
            specs = step_trace_specs(a.token_map_size, Path(d))
            for shape in a.shapes:
                for tag, spec in (specs if shape in HYBRID else specs[:1]):
                    path = f"{a.out}/{shape}{tag}-steps-b{a.step_trace}.txt"
                    print(step_trace(shape, a.step_trace, path, spec, timeline=a.chrome_trace),
                          flush=True)
                    torch.cuda.empty_cache()
        return
    if a.spec_host:
        spec_host(a.spec_host)
        return
    if a.forward_trace:
        for shape in a.shapes:
            # a hybrid's 4-token forward needs the per-position recurrent-state scratch that only
            # an engine with speculation allocates (without it the forward read out of bounds:
            # an illegal memory access in session 28's run 1)
            spec = (SpeculativeConfig(algorithm="nextn", num_steps=3, adaptive=False)
                    if shape in HYBRID else None)
            eng, _ = build(shape, False, spec)
            eng.warmup()
            for q in (1, 4):
                print(shape, forward_trace(eng, q, f"{a.out}/{shape}-forward-q{q}-chain.txt"),
                      flush=True)
            eng.runner.graphs = None
            del eng
            torch.cuda.empty_cache()
        return
    for shape in a.shapes:
        spec = (SpeculativeConfig(algorithm="nextn", num_steps=3, adaptive=False)
                if shape in HYBRID else None)
        eng, _ = build(shape, True, spec)
        for q in (1, 4):
            print(shape, kernel_table(eng, q, f"{a.out}/{shape}-kernels-q{q}.txt"), flush=True)
        eng.proposer = None
        del eng
        torch.cuda.empty_cache()
        host_profile(shape, spec, f"{a.out}/{shape}-host.txt")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
