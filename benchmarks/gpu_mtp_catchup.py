"""What a drafting step of an MTP engine costs after n plain steps under async scheduling: the
MTP first observes the n steps' backlog in one forward (spec/mtp.py ``catch_up``,
spec/mtp_backlog.py), then drafts. Batch 1, greedy, random weights, a gate that lets every n-th
step draft; per n, twice (the first pass may compile kernels for new shapes, the second shows
the steady cost): the drafting steps' median and slowest ms, the plain steps' median ms, and the
catch-up forward alone (synchronised) for a backlog of n positions.

    python benchmarks/gpu_mtp_catchup.py [--shape qwen3-next-3b] [--every 4 8 16 32 64]
    python benchmarks/gpu_mtp_catchup.py --shape tiny-qwen3-next --device cpu   # smoke run
"""

from __future__ import annotations

import argparse
import cProfile
import json
import statistics
import time

import torch

from gpu_mtp_speedup import PROMPT, _Every, build, profile_text
from mtpserve.config import SpeculativeConfig
from mtpserve.sampling_params import SamplingParams


SLOW_STEPS: list[str] | None = None   # --profile-slow: cProfile text of the first slow steps


def one_request(eng, every: int, new: int) -> dict:
    """One greedy request, drafting every ``every``-th step; step times split by kind (ms)."""
    p = eng.proposer
    p.policy.gate = _Every(every)
    catch, orig = [], p.catch_up

    def timed_catch_up():
        sync = eng.device.type == "cuda"
        if sync:
            torch.cuda.synchronize()
        t = time.perf_counter()
        n = p.backlog.num_tokens
        orig()
        if sync:
            torch.cuda.synchronize()
        if n:
            catch.append((n, (time.perf_counter() - t) * 1e3))

    p.catch_up = timed_catch_up
    eng.add_request(f"r{time.monotonic_ns()}", PROMPT,
                    SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True))
    drafting, plain = [], []
    try:
        while eng.has_unfinished_requests():
            decoding = not eng.scheduler.waiting and not any(s.in_prefill
                                                             for s in eng.scheduler.running)
            drafts = p.policy.gate.allows_next()
            prof = cProfile.Profile() if SLOW_STEPS is not None else None
            t = time.perf_counter()
            if prof is not None:
                prof.runcall(eng.step)
            else:
                eng.step()
            ms = (time.perf_counter() - t) * 1e3
            if prof is not None and ms > 20 and len(SLOW_STEPS) < 4:
                SLOW_STEPS.append(f"== every {every}, step of {ms:.1f} ms "
                                  f"(drafting: {drafts})\n{profile_text(prof, 25)}")
            if decoding:
                (drafting if drafts else plain).append(ms)
    finally:
        del p.catch_up
    return dict(drafting_median_ms=statistics.median(drafting) if drafting else None,
                drafting_max_ms=max(drafting, default=None),
                plain_median_ms=statistics.median(plain) if plain else None,
                catch_up=[(n, round(ms, 3)) for n, ms in catch])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-next-3b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--every", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    ap.add_argument("--new", type=int, default=160)
    ap.add_argument("--json")
    ap.add_argument("--profile-slow", help="cProfile every step; write the first 4 over 20 ms here")
    ap.add_argument("--log-compiles", help="append each Triton compile to this file")
    a = ap.parse_args()
    if a.log_compiles:
        from triton_compile_log import log_compiles

        log_compiles(a.log_compiles)
    global SLOW_STEPS
    if a.profile_slow:
        SLOW_STEPS = []
    eng = build(a.shape, a.device, SpeculativeConfig(algorithm="nextn", num_steps=3))
    eng.async_scheduling = True   # (the CUDA default; the CPU smoke run too)
    eng.warmup()
    eng.proposer.policy.prior, eng.proposer.policy.prior_weight = 0.99, 1e6
    rows = {}
    for every in a.every:
        for attempt in ("first", "second"):
            r = one_request(eng, every, a.new)
            rows[f"{every}/{attempt}"] = r
            print(f"every {every:3d} ({attempt}): drafting median {r['drafting_median_ms']} ms,"
                  f" max {r['drafting_max_ms']}; plain median {r['plain_median_ms']} ms; "
                  f"catch-up (positions, ms) {r['catch_up'][:6]}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.profile_slow:
        with open(a.profile_slow, "w") as f:
            f.write("\n".join(SLOW_STEPS))


if __name__ == "__main__":
    main()
