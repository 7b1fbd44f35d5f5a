"""Host time of an engine step, learned from the engine's own steps.

A step's wall time is the device time of its forward (on CUDA: the measured replay time of the
graph it used) plus host work: per sequence (scheduling, building its inputs, sampling and
appending its token, detokenizing; an MTP proposer's observe) and per draft token on top
(proposing it, verifying it, appending what is accepted). The speculation policy prices a
verify step with both; ignoring the host part made n-gram drafting at 64 concurrent requests
slower than none, and pricing per-step host time per token instead (every token of a verify
step charged a plain step's host time per sequence) kept MTP at batch 1 from ever drafting.

Plain steps (tokens == sequences) teach the time per sequence; steps with drafts teach the time
per draft token, as what their host time leaves over the sequences' share. Until a few steps
with drafts are seen, drafts are taken to cost no host time (the policy adds the proposer's
modelled cost instead, and the load gate, spec/load_gate.py, vetoes drafting where it measures
whole steps slower).

The first step with drafts after steps without teaches nothing: the proposer first catches up on
the plain steps (an MTP observes its backlog, spec/mtp_backlog.py; a draft model runs the tokens
it missed) and drafts from scratch, where a drafting step that follows another finds its drafts
made ahead (spec/draft_ahead.py). That switch is a one-off cost of the drafting arm, which the
load gate measures whole; priced per draft it made each draft cost 3x what it does (H200, hybrid
MoE MTP at batch 1: switch steps 5.3-5.8 ms, drafting steps that follow one another ~2.7 ms,
plain steps 1.26 ms), and drafts that accept every token were priced out.
"""

from __future__ import annotations

import statistics
from collections import deque


class StepTimer:
    """Host seconds per sequence and per draft token: the median of the last ``window`` samples
    of each, 0 until ``min_samples`` are seen.

    A median, not a mean: one step can take 100x the others (a kernel compiled or a cuDNN plan
    built on first use, a garbage collection, GPU clocks still low), and an estimate that prices
    drafts out stops the steps that would correct it (H200, the hybrid MoE's MTP engine: its
    first drafting steps took 50-150 ms, and the per-draft host time learned from them, 30-90
    ms, priced every later draft out). Steps with drafts are seen again only where the policy
    drafts; the policy explores on the load gate's probes (spec/policy.py).
    """

    def __init__(self, window: int = 15, min_samples: int = 3):
        self.min_samples = min_samples
        self._samples = {"seq": deque(maxlen=window), "draft": deque(maxlen=window)}
        self.host_per_seq = 0.0
        self.host_per_draft = 0.0

    def record(self, num_tokens: int, num_seqs: int, wall: float, device: float | None,
               after_plain: bool = False) -> None:
        """A step of ``num_seqs`` sequences and ``num_tokens`` tokens (the drafts: the rest)
        took ``wall`` seconds, ``device`` of them on the device (None: unknown, nothing
        learned). ``after_plain``: the step before it verified no drafts (a step with drafts
        is then a switch, not learned from: see the module doc)."""
        if device is None or num_seqs <= 0 or num_tokens < num_seqs:
            return
        if after_plain and num_tokens > num_seqs:
            return
        host = max(0.0, wall - device)
        if num_tokens == num_seqs:
            self.host_per_seq = self._add("seq", host / num_seqs)
        else:
            left = max(0.0, host - self.host_per_seq * num_seqs)
            self.host_per_draft = self._add("draft", left / (num_tokens - num_seqs))

    @property
    def drafts_measured(self) -> bool:
        """Whether enough steps with drafts were timed for ``host_per_draft`` (which then holds
        the proposer's work) to count."""
        return len(self._samples["draft"]) >= self.min_samples

    def host_seconds(self, num_tokens: int, num_seqs: int) -> float:
        """Predicted host seconds of a step of ``num_seqs`` sequences and ``num_tokens`` tokens."""
        return self.host_per_seq * num_seqs + self.host_per_draft * (num_tokens - num_seqs)

    def _add(self, key: str, sample: float) -> float:
        """Record ``sample`` under ``key``; return the estimate (0 until ``min_samples``)."""
        samples = self._samples[key]
        samples.append(sample)
        return statistics.median(samples) if len(samples) >= self.min_samples else 0.0
