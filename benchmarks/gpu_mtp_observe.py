"""What one MTP catch-up costs, by batch and run length: B greedy requests decode m plain steps
with drafting vetoed, then the MTP observes the backlog of B x m positions in one forward
(spec/mtp.py ``catch_up``), synchronised on both sides. Per (B, m): the median ms of
``--repeats`` catch-ups (host launch plus device), and for the first (B, m) a torch.profiler
table of one more catch-up (device time per kernel, host time per op) and a cProfile of
another, to see where a catch-up's time goes.

    python benchmarks/gpu_mtp_observe.py [--shape qwen3-next-3b] [--batch 1 16 64] [--steps 4 16]
    python benchmarks/gpu_mtp_observe.py --shape tiny-qwen3-next --device cpu --batch 2 --steps 2
"""

from __future__ import annotations

import argparse
import cProfile
import json
import statistics
import time

import torch

from gpu_mtp_speedup import _Every, build, profile_text
from mtpserve.config import SpeculativeConfig
from mtpserve.sampling_params import SamplingParams


def _sync(eng) -> None:
    if eng.device.type == "cuda":
        torch.cuda.synchronize()


def _timed_catch_up(eng, wrap=None) -> float:
    """One catch-up of the backlog now, synchronised before and after (ms); ``wrap``: a
    context manager around it (a profiler)."""
    p = eng.proposer
    _sync(eng)
    t = time.perf_counter()
    if wrap is None:
        p.catch_up()
    else:
        with wrap:
            p.catch_up()
    _sync(eng)
    return (time.perf_counter() - t) * 1e3


def measure(eng, batch: int, steps: int, repeats: int, prof_dir: str | None) -> dict:
    """``batch`` requests in decode; ``repeats`` + 1 times: ``steps`` plain steps, then one
    timed catch-up (the first untimed: it may compile). Returns ms per catch-up and positions."""
    p = eng.proposer
    p.backlog.max_tokens = p.backlog.max_steps = 10 ** 9   # only the catch-ups here
    n_steps = (repeats + 5) * steps + 8   # (the profiled catch-ups take two runs more)
    for i in range(batch):
        eng.add_request(f"b{batch}-{i}-{time.monotonic_ns()}",
                        [(7 * j + 13 * i) % 500 + 2 for j in range(128)],
                        SamplingParams(max_tokens=n_steps, temperature=0.0, ignore_eos=True))
    while any(s.in_prefill for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()
    for _ in range(2):   # the prompt's own catch-up, then a decode run of this length
        p.catch_up()
        for _ in range(steps):
            eng.step()
    p.catch_up()
    times, positions = [], []
    for r in range(repeats + (2 if prof_dir else 0)):
        for _ in range(steps):
            eng.step()
        positions.append(p.backlog.num_tokens)
        if prof_dir and r == repeats:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if eng.device.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            prof = torch.profiler.profile(activities=acts)
            _timed_catch_up(eng, prof)
            table = prof.key_averages()
            with open(f"{prof_dir}/catchup-b{batch}-m{steps}-kernels.txt", "w") as f:
                f.write(table.table(sort_by="self_cuda_time_total" if len(acts) > 1
                                    else "self_cpu_time_total", row_limit=40))
                f.write(table.table(sort_by="self_cpu_time_total", row_limit=40))
        elif prof_dir and r == repeats + 1:
            prof = cProfile.Profile()
            _timed_catch_up(eng, prof)
            with open(f"{prof_dir}/catchup-b{batch}-m{steps}-cprofile.txt", "w") as f:
                f.write(profile_text(prof, 45))
        else:
            times.append(_timed_catch_up(eng))
    while eng.has_unfinished_requests():
        eng.step()
    p.catch_up()
    return dict(batch=batch, steps=steps, positions=positions[0],
                median_ms=round(statistics.median(times), 3), min_ms=round(min(times), 3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-next-3b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile-dir", help="profiles of the largest batch's longest run here")
    ap.add_argument("--json")
    a = ap.parse_args()
    eng = build(a.shape, a.device, SpeculativeConfig(algorithm="nextn", num_steps=3),
                max_num_seqs=max(a.batch))
    eng.async_scheduling = True   # (the CUDA default; the CPU smoke run too)
    eng.warmup()
    eng.proposer.policy.gate = _Every(None)   # never drafts
    rows = []
    for b in a.batch:
        for m in a.steps:
            prof = a.profile_dir if (b, m) == (max(a.batch), max(a.steps)) else None
            r = measure(eng, b, m, a.repeats, prof)
            rows.append(r)
            print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
