"""Host time of an engine step, learned from the engine's own steps.

A step's wall time is the device time of its forward (on CUDA: the measured replay time of the
graph it used) plus host work: per sequence (scheduling, building its inputs, sampling and
appending its token, detokenizing; an MTP proposer's observe) and, per sequence that carries
drafts, the drafting on top (proposing, verifying, appending what is accepted; with async
scheduling also the overlap that a drafting step loses). The speculation policy prices a verify
step with both; ignoring the host part made n-gram drafting at 64 concurrent requests slower
than none, and pricing per-step host time per token instead (every token of a verify step
charged a plain step's host time per sequence) kept MTP at batch 1 from ever drafting.

Plain steps (tokens == sequences) teach the time per sequence; steps with drafts teach the time
per *drafting sequence* at their number of drafts per sequence m, as what their host time leaves
over the sequences' share. Not per draft token: most of a drafting step's extra time does not
grow with m (the step runs synchronously, reads its targets back once and launches one MTP chain
graph, whose extra steps are small forwards of one layer). Charged per draft, a step of m = 1
made its one draft cost what the whole step's drafting cost (H200, hybrid MoE MTP at batch 1:
0.80 ms per draft learned in a run accepting 1 draft of 3, against 0.37 ms in one accepting all
3; the former priced out the next run, accepting 2 of 3, which gains 1.44x when it drafts). Each
m keeps its own samples; an m not measured yet costs what the nearest larger measured m costs
(drafting more never costs less), or, above every measured m, what the largest costs: scaled by
m where the proposer's work grows with m (``drafting_scales``: a draft model runs a forward per
draft), as it is where it barely does (an MTP chain, n-gram look-ups). Until a few steps with
drafts are seen, drafting is taken to cost no host time (the policy adds the proposer's modelled
cost instead, and the load gate, spec/load_gate.py, vetoes drafting where it measures whole
steps slower).

The first step with drafts after steps without teaches nothing: the proposer first catches up on
the plain steps (an MTP observes its backlog, spec/mtp_backlog.py; a draft model runs the tokens
it missed) and drafts from scratch, where a drafting step that follows another finds its drafts
made ahead (spec/draft_ahead.py). That switch is a one-off cost of the drafting arm, which the
load gate measures whole; priced per draft it made each draft cost 3x what it does (H200, hybrid
MoE MTP at batch 1: switch steps 5.3-5.8 ms, drafting steps that follow one another ~2.7 ms,
plain steps 1.26 ms), and drafts that accept every token were priced out.

The drafting time of an m is forgotten ``max_age`` seconds after its last sample. A time learned
in a slow spell (host contention, a burst of long detokenizations) that prices drafting out is
never sampled again where nothing drafts, and the load gate does not probe a drafting arm it has
seen winning: speculation stayed off for good (a review's finding, with this timer in
benchmarks/cpu_policy_sim.py). Forgotten, the m is priced as before it was measured, drafts if
that pays, and is learned afresh from its next drafting steps. 10 s: in that simulation a 5 ms
slow spell left batch 1 at plain speed for good (763 tok/s, 8 drafting steps of 40000), and
forgotten after 10 s it drafted again within the phase (1432 tok/s); 30 s recovered later
(864) and cost one row 15% (one seed; BENCHMARKS.md, session 17). The price: where the host
stays slow, drafting that stayed off for free now restarts every 10 s, the load gate learns that
it loses and then probes it within its budget: 2-4% in a review's simulated rows (16 requests
at 0.7 with a 20 ms drafting overhead: 7461-7605 against 7767 tok/s). An idle spell past 10 s
also forgets, and the next requests relearn (a switch step and 3 timed drafting steps).
"""

from __future__ import annotations

import statistics
import time
from collections import deque


class StepTimer:
    """Host seconds per sequence and per drafting sequence (by drafts per sequence m): the
    median of the last ``window`` samples of each, 0 until ``min_samples`` are seen; an m's
    samples are dropped ``max_age`` seconds (of ``clock``) after its last one (module doc).

    A median, not a mean: one step can take 100x the others (a kernel compiled or a cuDNN plan
    built on first use, a garbage collection, GPU clocks still low), and an estimate that prices
    drafts out stops the steps that would correct it (H200, the hybrid MoE's MTP engine: its
    first drafting steps took 50-150 ms, and the per-draft host time learned from them, 30-90
    ms, priced every later draft out). Steps with drafts are seen again only where the policy
    drafts; the policy explores on the load gate's probes (spec/policy.py).
    """

    def __init__(self, window: int = 15, min_samples: int = 3, drafting_scales: bool = True,
                 max_age: float = 10.0, clock=time.monotonic):
        self.window, self.min_samples = window, min_samples
        self.drafting_scales = drafting_scales   # see the module doc
        self.max_age, self.clock = max_age, clock   # seconds; () -> seconds
        self._per_seq: deque = deque(maxlen=window)
        self._drafting: dict[int, deque] = {}   # m -> host seconds per drafting sequence
        self._medians: dict[int, float] = {}     # m -> their median, once min_samples are seen
        self._sampled_at: dict[int, float] = {}  # m -> clock() of its last sample
        self.host_per_seq = 0.0

    def record(self, num_tokens: int, num_seqs: int, wall: float, device: float | None,
               after_plain: bool = False, num_drafting: int | None = None) -> None:
        """A step of ``num_seqs`` sequences and ``num_tokens`` tokens (the drafts: the rest)
        took ``wall`` seconds, ``device`` of them on the device (None: unknown, nothing
        learned). ``num_drafting``: the sequences that carried drafts (None: all of them).
        ``after_plain``: the step before it verified no drafts (a step with drafts is then a
        switch, not learned from: see the module doc)."""
        if device is None or num_seqs <= 0 or num_tokens < num_seqs:
            return
        drafts = num_tokens - num_seqs
        if after_plain and drafts:
            return
        host = max(0.0, wall - device)
        if not drafts:
            self._per_seq.append(host / num_seqs)
            if len(self._per_seq) >= self.min_samples:
                self.host_per_seq = statistics.median(self._per_seq)
            return
        self._expire()   # a fresh sample must not join samples past their age
        drafting = min(num_seqs, num_drafting or num_seqs)
        left = max(0.0, host - self.host_per_seq * num_seqs)
        m = max(1, round(drafts / drafting))
        samples = self._drafting.setdefault(m, deque(maxlen=self.window))
        samples.append(left / drafting)
        self._sampled_at[m] = self.clock()
        if len(samples) >= self.min_samples:
            self._medians[m] = statistics.median(samples)

    def _expire(self) -> None:
        """Forget each m whose last sample is more than ``max_age`` seconds old (module doc)."""
        if not self._sampled_at:
            return
        old = self.clock() - self.max_age
        for m in [m for m, t in self._sampled_at.items() if t < old]:
            del self._sampled_at[m], self._drafting[m]
            self._medians.pop(m, None)

    @property
    def drafts_measured(self) -> bool:
        """Whether enough recent steps with drafts were timed for the drafting host time
        (which then holds the proposer's work) to count."""
        self._expire()
        return bool(self._medians)

    def host_per_drafting_seq(self, m: int) -> float:
        """Host seconds a sequence verifying ``m`` drafts adds over a plain one (module doc:
        an unmeasured m costs the nearest larger measured m, or the largest one's, scaled by m
        if ``drafting_scales``; forgotten ``max_age`` seconds after its last sample)."""
        self._expire()
        measured = self._medians
        if not measured:
            return 0.0
        larger = [k for k in measured if k >= m]
        if larger:
            return measured[min(larger)]
        top = max(measured)
        return measured[top] * (m / top if self.drafting_scales else 1.0)

    def host_seconds(self, num_tokens: int, num_seqs: int) -> float:
        """Predicted host seconds of a step of ``num_seqs`` sequences and ``num_tokens`` tokens,
        the drafts spread evenly over all sequences."""
        drafts = num_tokens - num_seqs
        host = self.host_per_seq * num_seqs
        if drafts > 0:
            host += num_seqs * self.host_per_drafting_seq(max(1, round(drafts / num_seqs)))
        return host
