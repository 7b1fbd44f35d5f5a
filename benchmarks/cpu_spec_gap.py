"""Host work on the critical path of synchronous (drafting) steps, on the CPU.

A drafting step under async scheduling still runs synchronously (its proposals need the newest
tokens on the host): the device waits from the moment the step's results are read back until
the next step's forward is launched. This measures that stretch, from the end of ``verify()``
(the read-back; on the CPU also the argmax, which is device work on a GPU) to the next
``ModelRunner.execute``, in CPU time of the engine's thread (``time.thread_time``: a loaded
2-core machine moved wall-clock medians by +-40% from run to run), with the n-gram proposer
drafting k = 4 at every step over the tiny random model of benchmarks/cpu_host.py.

    python benchmarks/cpu_spec_gap.py [--concurrency 64] [--rounds 5]

Prints the median over each round's steps, per round (the first round, which warms up, is
left out). Run it under two source trees (``PYTHONPATH=<tree>/src``) to compare them.
"""

from __future__ import annotations

import argparse
import statistics
import time

from cpu_host import prompts

from mtpserve.bench.random_model import random_model_files
from mtpserve.config import EngineConfig, SpeculativeConfig
from mtpserve.engine import engine as engine_module
from mtpserve.engine.engine import LLMEngine
from mtpserve.sampling_params import SamplingParams


class AlwaysDraft:
    """A load gate that lets every step draft (spec/load_gate.py's interface)."""

    def allow(self, num_seqs):
        return True

    def exploring(self, num_seqs):
        return False

    def record(self, *args, **kwargs):
        pass


def gaps_per_round(conc: int, rounds: int, tokens: int = 64) -> list[float]:
    """Median host seconds (thread CPU time) from a read-back to the next launch, per round."""
    spec = SpeculativeConfig(algorithm="ngram", num_steps=4)
    cfg = EngineConfig(device="cpu", dtype="float32", max_model_len=1024, max_num_seqs=conc,
                       speculative=spec, async_scheduling=True)
    eng = LLMEngine(cfg, files=random_model_files("tiny-llama", device="cpu"))
    eng.proposer.policy.gate = AlwaysDraft()
    read_at, gaps = [None], []
    verify, execute = engine_module.verify, eng.runner.execute

    def timed_verify(*args, **kwargs):
        out = verify(*args, **kwargs)
        read_at[0] = time.thread_time()
        return out

    def timed_execute(batch):
        if read_at[0] is not None:
            gaps.append(time.thread_time() - read_at[0])
            read_at[0] = None
        return execute(batch)

    engine_module.verify, eng.runner.execute = timed_verify, timed_execute
    p = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    out = []
    try:
        for r in range(rounds + 1):
            for i, ids in enumerate(prompts(conc, seed=r)):
                eng.add_request(f"r{r}-{i}", ids, p)
            gaps.clear()
            while eng.has_unfinished_requests():
                eng.step()
            if r:
                out.append(statistics.median(gaps))
    finally:
        engine_module.verify = verify
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    got = gaps_per_round(a.concurrency, a.rounds)
    print(f"c={a.concurrency}: read-back -> next launch, thread CPU ms, median per round: "
          + " ".join(f"{g * 1e3:.3f}" for g in got))


if __name__ == "__main__":
    main()
