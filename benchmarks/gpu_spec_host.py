"""Where a synchronous n-gram drafting step's host time goes, on the GPU with the real SmolLM2.

A drafting step runs synchronously: the device idles from the read-back of one step's tokens
(the end of ``verify()``) to the launch of the next forward (``ModelRunner.execute``). At one
request on the H100 (session 37) a drafting step took 0.95 ms of wall time where an overlapped
plain step took 0.59: the verify forward of 5 tokens costs ~1.07x a decode's on the device, so
most of the difference is this host stretch. This splits it by phase, in wall-clock
microseconds per drafting step (median over the steps of every measured round), with the
n-gram proposer drafting k tokens at every step (the load gate set aside, as
benchmarks/cpu_spec_gap.py does on the CPU):

- ``verify->step``: from the read-back to the return of ``step()`` (appending, stop checks,
  the proposer's observe, settling, outputs, the policy's record);
- ``between``: from that return to the next ``propose`` (the caller's loop, ``step()``'s
  start, the gate);
- ``propose``, ``schedule+`` (propose's end to ``prepare``), ``prepare``, ``patch+launch``
  (``prepare``'s end to ``execute``'s return: the graph's launch);
- ``gap``: the read-back to the next launch's start, all of the above but the launch's end;
- ``step``: one ``step()`` call's wall time.

    python benchmarks/gpu_spec_host.py [--concurrency 1] [--rounds 3] [--set code-edit]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from cpu_spec_gap import AlwaysDraft
from gpu_spec import chat_ids

from mtpserve import LLM, SamplingParams
from mtpserve.bench.prompts import prompt_set
from mtpserve.engine import engine as engine_module

PHASES = ("verify->step", "between", "propose", "schedule+", "prepare", "patch+launch", "gap",
          "step")


class Stamps:
    """perf_counter stamps of one step's marks, filed per phase when the next launch comes."""

    def __init__(self):
        self.marks: dict[str, float] = {}
        self.phases: dict[str, list[float]] = {p: [] for p in PHASES}
        self.on = False

    def mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter()

    def launch_started(self) -> None:
        """The next forward's launch begins: file the stretch since the last read-back."""
        m = self.marks
        if self.on and "read" in m and "propose0" in m:
            self.phases["gap"].append(time.perf_counter() - m["read"])
            self._file("verify->step", "read", "returned")
            self._file("between", "returned", "propose0")
            self._file("propose", "propose0", "propose1")
            self._file("schedule+", "propose1", "prepare0")
            self._file("prepare", "prepare0", "prepare1")
        self.marks = {k: v for k, v in m.items() if k in ("prepare1",)}

    def _file(self, phase: str, a: str, b: str) -> None:
        if a in self.marks and b in self.marks:
            self.phases[phase].append(self.marks[b] - self.marks[a])


def instrument(llm, st: Stamps):
    """Wrap ``llm``'s engine so that ``st`` is stamped at each mark; returns an undo callable."""
    eng = llm.engine
    verify, execute, prepare = engine_module.verify, eng.runner.execute, eng.runner.prepare
    propose, step = eng.proposer.propose, eng.step

    def timed_verify(*a, **k):
        out = verify(*a, **k)
        st.mark("read")
        return out

    def timed_execute(batch):
        st.launch_started()
        out = execute(batch)
        if st.on and "prepare1" in st.marks:
            st.phases["patch+launch"].append(time.perf_counter() - st.marks["prepare1"])
        return out

    def timed_prepare(sched):
        st.mark("prepare0")
        out = prepare(sched)
        st.mark("prepare1")
        return out

    def timed_propose(*a, **k):
        st.mark("propose0")
        out = propose(*a, **k)
        st.mark("propose1")
        return out

    def timed_step():
        t = time.perf_counter()
        out = step()
        if st.on:
            st.phases["step"].append(time.perf_counter() - t)
        st.mark("returned")
        return out

    engine_module.verify = timed_verify
    eng.runner.execute, eng.runner.prepare = timed_execute, timed_prepare
    eng.proposer.propose, eng.step = timed_propose, timed_step

    def undo():
        engine_module.verify = verify
        for obj, name in ((eng.runner, "execute"), (eng.runner, "prepare"),
                          (eng.proposer, "propose"), (eng, "step")):
            delattr(obj, name)
    return undo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--set", default="code-edit")
    ap.add_argument("--prompts", type=int, default=8, help="prompts of the set per round")
    ap.add_argument("--json")
    a = ap.parse_args()
    llm = LLM(None, dtype="bfloat16", max_model_len=2048, max_num_seqs=64,
              gpu_memory_utilization=0.4, speculative_algorithm="ngram",
              speculative_num_steps=a.k)
    llm.engine.proposer.policy.gate = AlwaysDraft()
    prompts = [chat_ids(llm.tokenizer, t) for t in prompt_set(a.set)][: a.prompts]
    p = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True)
    st = Stamps()
    undo = instrument(llm, st)
    try:
        for r in range(a.rounds + 1):   # round 0 warms up
            st.on = r > 0
            if a.concurrency == 1:
                for ids in prompts:
                    llm.generate([ids], p)
            else:
                batch = [prompts[i % len(prompts)] for i in range(a.concurrency)]
                llm.generate(batch, p)
    finally:
        undo()
    res = {ph: statistics.median(v) * 1e6 for ph, v in st.phases.items() if v}
    counts = {ph: len(v) for ph, v in st.phases.items()}
    print(f"n-gram k={a.k}, {a.set}, c={a.concurrency}, every step drafting; median us a step "
          f"({counts['gap']} read-back -> launch stretches):")
    for ph in PHASES:
        if ph in res:
            print(f"  {ph:>14}: {res[ph]:8.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"median_us": res, "counts": counts, "args": vars(a)}, f, indent=2)


if __name__ == "__main__":
    main()
