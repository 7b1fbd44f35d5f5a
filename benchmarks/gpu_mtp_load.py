"""An MTP engine whose drafts are never accepted (random weights), under load: where its steps go.

``mtpserve bench --compare`` of the hybrid MoE MTP shape on the H200 (session 11) gave 0.46x
total tok/s at 64 concurrent requests with an acceptance length of 1.000. This runs the same
load in process: per concurrency n, n greedy requests of distinct 128-token prompts and
``--new`` tokens each, added at once, twice (``cold``: the first time this engine sees the
load, as a fresh server does; ``warm``: again), for a plain engine and for the MTP engine with
the adaptive policy. Per pass: total tok/s, the steps by kind (overlapped plain, synchronous
with drafts, synchronous without) with count, median and slowest ms; for the MTP engine also
the sequences per drafting step, the catch-up forwards (count, positions) and the gate's
tokens/s per arm and batch bucket. ``--log-compiles F``: each Triton compile, with the pass it
happened in.

    python benchmarks/gpu_mtp_load.py [--shape qwen3-next-3b] [--concurrency 1 16 64] [--json F]
    python benchmarks/gpu_mtp_load.py --shape tiny-qwen3-next --device cpu --new 8  # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import statistics
import time
import traceback
import warnings
from collections import defaultdict

import torch
from gpu_mtp_speedup import build, profile_text
from mtpserve.config import SpeculativeConfig
from mtpserve.engine.engine import LLMEngine
from mtpserve.kernels.paged_attention import SMALL_QUERY
from mtpserve.sampling_params import SamplingParams


class SyncWatch:
    """With ``on``: CUDA's sync debug mode ("warn") inside :meth:`watch`, each distinct host sync
    kept with its label and Python stack (at most ``limit``), to find what drains the async
    pipeline in a catch-up."""

    def __init__(self, on: bool = False, limit: int = 24):
        self.on, self.limit = on, limit
        self.found: dict[str, dict] = {}
        self._depth = 0

    @contextlib.contextmanager
    def watch(self, label: str):
        if not self.on or self._depth:   # nested: the outer watch's mode and hook hold
            yield
            return

        def hook(message, *_a, **_k):
            stack = "".join(traceback.format_stack(limit=14)[:-2])
            key = stack[-600:]
            d = self.found.get(key)
            if d is None and len(self.found) < self.limit:
                d = self.found[key] = dict(label=label, message=str(message), stack=stack,
                                           count=0)
            if d is not None:
                d["count"] += 1

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            old, warnings.showwarning = warnings.showwarning, hook
            torch.cuda.set_sync_debug_mode("warn")
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                torch.cuda.set_sync_debug_mode("default")
                warnings.showwarning = old


SYNCS = SyncWatch()


class StepLog:
    """Wraps an engine's step kinds and its proposer's drafting and catch-up, and times them."""

    def __init__(self, eng: LLMEngine, sync_catch_ups: bool = False,
                 cprofile: cProfile.Profile | None = None, slow_ms: float | None = None):
        self.eng, self.sync_catch_ups, self.cprofile = eng, sync_catch_ups, cprofile
        self._profiling = False
        self.slow_ms = slow_ms   # each synchronous step cProfiled alone; those slower kept
        self.slow: list[tuple[float, str]] = []   # (ms, profile text) of the slowest 4
        self.catch_up_ms: list[float] = []
        self.ms = defaultdict(list)       # kind -> wall ms of each step of that kind
        self.drafting_seqs: list[int] = []
        self._wrapped: list[tuple[object, str]] = []
        self.catch_ups: list[int] = []
        self.longest_chunk: list[int] = []   # per catch-up: the backlog's longest step chunk
        self._wrap(eng, "_overlapped_step", self._overlapped)
        self._wrap(eng, "_sync_step", self._sync)
        p = eng.proposer
        if p is not None:
            self._wrap(p, "draft", lambda f, work: (self.drafting_seqs.append(len(work)),
                                                    f(work))[1])
            self._wrap(p, "catch_up", self._catch_up)

    def _wrap(self, obj, name, hook):
        orig = getattr(obj, name)
        setattr(obj, name, lambda *a: hook(orig, *a))
        self._wrapped.append((obj, name))

    def close(self) -> None:
        """Put the wrapped methods back (the next pass wraps afresh)."""
        for obj, name in self._wrapped:
            delattr(obj, name)
        self._wrapped.clear()

    def _overlapped(self, f, *a):
        t = time.perf_counter()
        with SYNCS.watch("overlapped step"):
            out = f(*a)
        self.ms["overlapped plain"].append((time.perf_counter() - t) * 1e3)
        return out

    @contextlib.contextmanager
    def _host_profile(self):
        """The cProfile (if any) on around the outermost wrapped call: catch-ups and synchronous
        steps, whose host time is what the MTP adds over plain overlapped steps."""
        if self.cprofile is None or self._profiling:
            yield
            return
        self._profiling = True
        self.cprofile.enable()
        try:
            yield
        finally:
            self.cprofile.disable()
            self._profiling = False

    def _sync(self, f, *a):
        if self.slow_ms is not None and self.cprofile is None:
            prof = cProfile.Profile()
            t = time.perf_counter()
            out = prof.runcall(f, *a)
            ms = (time.perf_counter() - t) * 1e3
            if ms > self.slow_ms:
                self.slow.append((ms, profile_text(prof, 30)))
                self.slow = sorted(self.slow, key=lambda x: -x[0])[:4]
        else:
            t = time.perf_counter()
            with self._host_profile():
                out = f(*a)
            ms = (time.perf_counter() - t) * 1e3
        kind = "sync drafting" if self.eng._drafted else "sync plain"
        self.ms[kind].append(ms)
        return out

    def _catch_up(self, f):
        backlog = self.eng.proposer.backlog
        n = backlog.num_tokens
        if not n:
            return f()
        self.catch_ups.append(n)
        longest = max(k for items, _, _ in backlog._steps for _, _, k in items)
        self.longest_chunk.append(longest)
        if self.sync_catch_ups:   # its device time: synchronize around it (breaks overlap)
            torch.cuda.synchronize()
        t = time.perf_counter()
        with SYNCS.watch(f"catch-up of {n} positions, longest chunk {longest}"), \
                self._host_profile():
            out = f()
        if self.sync_catch_ups:
            torch.cuda.synchronize()
        self.catch_up_ms.append((time.perf_counter() - t) * 1e3)
        return out

    def _catch_ups_by_kind(self) -> dict:
        """Catch-ups of decode positions only (every step chunk <= SMALL_QUERY) and with a
        prefill chunk: count, positions, host ms in all."""
        out = {}
        for n, longest, ms in zip(self.catch_ups, self.longest_chunk, self.catch_up_ms):
            d = out.setdefault("decode" if longest <= SMALL_QUERY else "with prefill",
                               dict(count=0, positions=0, ms=0.0))
            d["count"] += 1
            d["positions"] += n
            d["ms"] = round(d["ms"] + ms, 1)
        return out

    def summary(self) -> dict:
        kinds = {k: dict(steps=len(v), median_ms=round(statistics.median(v), 3),
                         max_ms=round(max(v), 1), total_ms=round(sum(v), 1))
                 for k, v in self.ms.items()}
        out = dict(kinds=kinds)
        if self.eng.proposer is not None:
            out.update(drafting_steps=len(self.drafting_seqs),
                       seqs_per_drafting_step=(round(statistics.mean(self.drafting_seqs), 1)
                                               if self.drafting_seqs else 0),
                       catch_ups=len(self.catch_ups), catch_up_positions=sum(self.catch_ups),
                       catch_up_ms=dict(max=round(max(self.catch_up_ms, default=0), 1),
                                        total=round(sum(self.catch_up_ms), 1)),
                       catch_up_ms_by_kind=self._catch_ups_by_kind())
            gate = self.eng.proposer.policy.gate if self.eng.proposer.policy else None
            if gate is not None:
                out["gate_tok_s"] = {f"<={2 ** b}": {("drafting" if k else "plain"): round(r)
                                                     for k, r in bk.rate.items()}
                                     for b, bk in sorted(gate._buckets.items())}
        return out


def load(eng: LLMEngine, n: int, new: int, sync_catch_ups: bool = False, stagger: int = 0,
         cprofile: cProfile.Profile | None = None, slow_ms: float | None = None
         ) -> tuple[float, StepLog]:
    """``n`` greedy requests, added at once (``stagger`` 0) or one every ``stagger`` steps, as
    HTTP requests reach a server's engine loop over its first steps; (total tok/s from the first
    step to the last, the step log of this load)."""
    log = StepLog(eng, sync_catch_ups, cprofile, slow_ms)

    def add(i: int) -> None:
        prompt = [(7 * j + 13 * i) % 500 + 2 for j in range(128)]
        eng.add_request(f"r{i}-{time.monotonic_ns()}", prompt,
                        SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True))

    added = n if not stagger else 1
    for i in range(added):
        add(i)
    t, tokens, steps = time.perf_counter(), 0, 0
    try:
        while eng.has_unfinished_requests() or added < n:
            tokens += sum(len(o.new_token_ids) for o in eng.step())
            steps += 1
            if added < n and steps % stagger == 0:
                add(added)
                added += 1
    finally:
        log.close()
    return tokens / (time.perf_counter() - t), log


VARIANTS = ("main", "graph256", "every1", "every4")


def set_variant(eng: LLMEngine, name: str, defaults: tuple[int, int]) -> None:
    """The MTP backlog's limits for variant ``name`` (``defaults``: the engine's own max_tokens,
    max_steps): main as built; graph256: at most the largest captured MTP graph's tokens, so
    decode catch-ups replay it; every1 / every4: a catch-up after every step / every 4 steps."""
    b = eng.proposer.backlog
    b.max_tokens, b.max_steps = defaults
    graphs = eng.proposer.runner.graphs
    if name == "graph256" and graphs is not None and graphs.sizes:
        b.max_tokens = min(b.max_tokens, graphs.sizes[-1])
    elif name.startswith("every"):
        b.max_steps = int(name[len("every"):])


@contextlib.contextmanager
def _profiled(out_dir: str | None, name: str):
    """With ``out_dir``: the torch profiler around the block, its costliest ops by device time
    and by host time written to ``out_dir/{name}-kernels.txt``."""
    if out_dir is None:
        yield
        return
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        yield
    table = prof.key_averages()
    with open(f"{out_dir}/{name}-kernels.txt", "w") as f:
        f.write(table.table(sort_by="cuda_time_total", row_limit=45))
        f.write(table.table(sort_by="self_cpu_time_total", row_limit=30))


def _allocator_counts(device: str) -> dict:
    """The CUDA caching allocator's counters that mean a host stall: retries after a failed
    allocation (each frees cached blocks, a device-wide sync), device allocations and frees
    (cudaMalloc / cudaFree); empty off CUDA."""
    if device != "cuda":
        return {}
    st = torch.cuda.memory_stats()
    return {k: st.get(k, 0) for k in ("num_alloc_retries", "num_device_alloc",
                                      "num_device_free", "num_sync_all_streams")}


def _write_host_profile(prof: cProfile.Profile, path: str) -> None:
    with open(path, "w") as f:
        f.write(profile_text(prof, 40, by_own_time=True))


def _mark(path: str | None, text: str) -> None:
    """A line in the compile log: the compiles after it happened in this pass."""
    if path:
        with open(path, "a") as f:
            f.write(f"== {text}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-next-3b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--json")
    ap.add_argument("--log-compiles", help="append each Triton compile to this file")
    ap.add_argument("--torch-profile", metavar="DIR",
                    help="profile the warm pass at the largest concurrency into DIR")
    ap.add_argument("--sync-catch-ups", action="store_true",
                    help="time each MTP catch-up on the device (synchronizes around it)")
    ap.add_argument("--stagger", type=int, default=0,
                    help="add one request every STAGGER steps (0: all at once)")
    ap.add_argument("--variants", nargs="+", default=["main"], choices=VARIANTS,
                    help="MTP backlog limits to run, each on the same MTP engine")
    ap.add_argument("--cprofile", metavar="FILE",
                    help="cProfile the host time of the MTP engine's catch-ups and synchronous "
                         "steps in its warm pass at the largest concurrency into FILE")
    ap.add_argument("--slow-steps", nargs=2, metavar=("MS", "FILE"),
                    help="cProfile each synchronous step alone; the 4 slowest over MS per pass "
                         "into FILE")
    ap.add_argument("--find-syncs", metavar="FILE",
                    help="list the host syncs inside catch-ups (CUDA sync debug mode) in FILE")
    a = ap.parse_args()
    if a.log_compiles:
        from triton_compile_log import log_compiles

        log_compiles(a.log_compiles)
    SYNCS.on = bool(a.find_syncs)
    seqs = max(a.concurrency)
    rows = {}
    spec = SpeculativeConfig(algorithm="nextn", num_steps=3, adaptive=True)
    for name, cfg in (("off", None), ("on", spec)):
        eng = build(a.shape, a.device, cfg, max_num_seqs=seqs)
        eng.warmup()
        p = eng.proposer
        defaults = (p.backlog.max_tokens, p.backlog.max_steps) if p is not None else None
        for variant in (a.variants if cfg is not None else ["off"]):
            if defaults is not None:
                set_variant(eng, variant, defaults)
            label = name if variant in ("off", "main") else variant
            for n in a.concurrency:
                for rnd in ("cold", "warm"):
                    _mark(a.log_compiles, f"{label} c={n} {rnd}")
                    prof = (a.torch_profile and n == max(a.concurrency) and rnd == "warm")
                    host = (cProfile.Profile() if a.cprofile and cfg is not None
                            and n == max(a.concurrency) and rnd == "warm" else None)
                    before = _allocator_counts(a.device)
                    with _profiled(a.torch_profile if prof else None, label):
                        tok_s, log = load(eng, n, a.new, a.sync_catch_ups, a.stagger, host,
                                          float(a.slow_steps[0]) if a.slow_steps else None)
                    if a.slow_steps and log.slow:
                        with open(a.slow_steps[1], "a") as f:
                            for ms, text in log.slow:
                                f.write(f"== {label} c={n} {rnd}: sync step of {ms:.1f} ms\n"
                                        f"{text}\n")
                    if host is not None:
                        _write_host_profile(host, f"{a.cprofile}.{label}.txt")
                    if prof:
                        with open(f"{a.torch_profile}/{label}-steps.json", "w") as f:
                            json.dump(dict(ms=log.ms, catch_up_ms=log.catch_up_ms), f)
                    summary = log.summary()
                    summary["allocator"] = {k: v - before.get(k, 0)
                                            for k, v in _allocator_counts(a.device).items()}
                    rows.setdefault(f"{n} {rnd}", {})[label] = dict(tok_s=round(tok_s, 1),
                                                                   **summary)
                    print(f"{label:>8} c={n:<3} {rnd} {tok_s:9.1f} tok/s  "
                          f"{json.dumps(summary)}", flush=True)
        del eng
    for key, r in rows.items():
        for label in list(r):
            if label != "off":
                r[f"{label}_off"] = round(r[label]["tok_s"] / r["off"]["tok_s"], 3)
        print(f"c={key:<8} " + "  ".join(f"{k} {v:.3f}x" for k, v in r.items()
                                          if k.endswith("_off")))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.find_syncs:
        with open(a.find_syncs, "w") as f:
            json.dump(list(SYNCS.found.values()), f, indent=1)


if __name__ == "__main__":
    main()
