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
import json
import statistics
import time
from collections import defaultdict

import torch
from gpu_mtp_speedup import build
from mtpserve.config import SpeculativeConfig
from mtpserve.engine.engine import LLMEngine
from mtpserve.sampling_params import SamplingParams


class StepLog:
    """Wraps an engine's step kinds and its proposer's drafting and catch-up, and times them."""

    def __init__(self, eng: LLMEngine, sync_catch_ups: bool = False):
        self.eng, self.sync_catch_ups = eng, sync_catch_ups
        self.catch_up_ms: list[float] = []
        self.ms = defaultdict(list)       # kind -> wall ms of each step of that kind
        self.drafting_seqs: list[int] = []
        self._wrapped: list[tuple[object, str]] = []
        self.catch_ups: list[int] = []
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
        out = f(*a)
        self.ms["overlapped plain"].append((time.perf_counter() - t) * 1e3)
        return out

    def _sync(self, f, *a):
        t = time.perf_counter()
        out = f(*a)
        kind = "sync drafting" if self.eng._drafted else "sync plain"
        self.ms[kind].append((time.perf_counter() - t) * 1e3)
        return out

    def _catch_up(self, f):
        n = self.eng.proposer.backlog.num_tokens
        if not n:
            return f()
        self.catch_ups.append(n)
        if self.sync_catch_ups:   # its device time: synchronize around it (breaks overlap)
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = f()
        if self.sync_catch_ups:
            torch.cuda.synchronize()
        self.catch_up_ms.append((time.perf_counter() - t) * 1e3)
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
                                        total=round(sum(self.catch_up_ms), 1)))
            gate = self.eng.proposer.policy.gate if self.eng.proposer.policy else None
            if gate is not None:
                out["gate_tok_s"] = {f"<={2 ** b}": {("drafting" if k else "plain"): round(r)
                                                     for k, r in bk.rate.items()}
                                     for b, bk in sorted(gate._buckets.items())}
        return out


def load(eng: LLMEngine, n: int, new: int, sync_catch_ups: bool = False
         ) -> tuple[float, StepLog]:
    """``n`` greedy requests added at once; (total tok/s from the first step to the last, the
    step log of this load)."""
    log = StepLog(eng, sync_catch_ups)
    for i in range(n):
        prompt = [(7 * j + 13 * i) % 500 + 2 for j in range(128)]
        eng.add_request(f"r{i}-{time.monotonic_ns()}", prompt,
                        SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True))
    t, tokens = time.perf_counter(), 0
    try:
        while eng.has_unfinished_requests():
            tokens += sum(len(o.new_token_ids) for o in eng.step())
    finally:
        log.close()
    return tokens / (time.perf_counter() - t), log


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
    a = ap.parse_args()
    if a.log_compiles:
        from triton_compile_log import log_compiles

        log_compiles(a.log_compiles)
    seqs = max(a.concurrency)
    rows = {}
    spec = SpeculativeConfig(algorithm="nextn", num_steps=3, adaptive=True)
    for name, cfg in (("off", None), ("on", spec)):
        eng = build(a.shape, a.device, cfg, max_num_seqs=seqs)
        eng.warmup()
        for n in a.concurrency:
            for rnd in ("cold", "warm"):
                _mark(a.log_compiles, f"{name} c={n} {rnd}")
                prof = (a.torch_profile and n == max(a.concurrency) and rnd == "warm")
                with _profiled(a.torch_profile if prof else None, name):
                    tok_s, log = load(eng, n, a.new, a.sync_catch_ups)
                if prof:
                    with open(f"{a.torch_profile}/{name}-steps.json", "w") as f:
                        json.dump(dict(ms=log.ms, catch_up_ms=log.catch_up_ms), f)
                summary = log.summary()
                rows.setdefault(f"{n} {rnd}", {})[name] = dict(tok_s=round(tok_s, 1), **summary)
                print(f"{name:>3} c={n:<3} {rnd} {tok_s:9.1f} tok/s  {json.dumps(summary)}",
                      flush=True)
        del eng
    for key, r in rows.items():
        r["on_off"] = round(r["on"]["tok_s"] / r["off"]["tok_s"], 3)
        print(f"c={key:<8} on/off total tok/s {r['on_off']:.3f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
