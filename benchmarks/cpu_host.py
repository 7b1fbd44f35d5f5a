"""Host-side cost of engine steps at high concurrency, on the CPU with a tiny random model (two
layers of width 64 over a 49152-token vocabulary), so that the engine's own Python work — not the
forward — dominates a step. Same scheduling, input, sampling, verification and output code as on
the GPU (the GPU's forward and its attention metadata differ).

    python benchmarks/cpu_host.py [--concurrency 64] [--tokens 64]

Prints, for speculation off and n-gram on (k = 4), the median wall time of a decode step and the
cumulative cProfile milliseconds per step of each engine phase (cProfile adds its own cost).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import time

from mtpserve.bench.random_model import random_model_files
from mtpserve.config import EngineConfig, SpeculativeConfig
from mtpserve.engine.engine import LLMEngine
from mtpserve.sampling_params import SamplingParams

PHASES = ("propose", "schedule", "prepare", "execute", "_verify", "_sample", "observe",
          "_postprocess", "_record_for_policy")


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Repetitive prompts (a 12-token phrase four times) so that n-gram finds drafts."""
    rng = random.Random(seed)
    return [[rng.randrange(2, 49152) for _ in range(12)] * 4 for _ in range(n)]


def run(spec: SpeculativeConfig | None, conc: int, tokens: int) -> None:
    cfg = EngineConfig(device="cpu", dtype="float32", max_model_len=1024, max_num_seqs=conc,
                       speculative=spec)
    eng = LLMEngine(cfg, files=random_model_files("tiny-llama", device="cpu"))
    p = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    for i, ids in enumerate(prompts(conc)):
        eng.add_request(f"r{i}", ids, p)
    while eng.scheduler.waiting or any(s.in_prefill for s in eng.scheduler.running):
        eng.step()
    walls, prof = [], cProfile.Profile()
    while eng.has_unfinished_requests():
        t = time.perf_counter()
        eng.step()
        walls.append(time.perf_counter() - t)
    for i, ids in enumerate(prompts(conc, seed=1)):      # the same load again, profiled
        eng.add_request(f"p{i}", ids, p)
    while eng.scheduler.waiting or any(s.in_prefill for s in eng.scheduler.running):
        eng.step()
    n = 0
    while eng.has_unfinished_requests():
        prof.enable()
        eng.step()
        prof.disable()
        n += 1
    stats = pstats.Stats(prof).stats
    parts = {name: ct / n * 1e3 for (f, _, name), (_, _, _, ct, _) in stats.items()
             if name in PHASES and "mtpserve" in f}
    name = spec.algorithm if spec else "off"
    acc = eng.spec_metrics.acceptance_length
    print(f"{name:6} c={conc}: median step {statistics.median(walls) * 1e3:.3f} ms "
          f"({len(walls)} steps{f', acceptance length {acc:.2f}' if acc else ''}); "
          f"under cProfile: " + ", ".join(f"{k} {parts[k]:.3f}" for k in PHASES if k in parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    run(None, a.concurrency, a.tokens)
    run(SpeculativeConfig(algorithm="ngram", num_steps=4), a.concurrency, a.tokens)


if __name__ == "__main__":
    main()
