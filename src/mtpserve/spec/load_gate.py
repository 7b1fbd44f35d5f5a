"""Measured veto on speculation: draft only at batch sizes where drafting steps have been seen to
emit more tokens per second than plain steps.

The draft-length policy (policy.py) prices a verify step from the captured graphs' replay times
plus a learned host time per sequence and per draft. Host work that does not scale that way
(proposing, verifying and appending for many requests at once) can still make speculation slower
than plain decoding at high load: measured on the H200 with n-gram drafts at 64 concurrent
requests, 0.53x. This gate measures what matters instead — tokens emitted per second of the engine's
wall time — separately for the steps it let draft and the steps it vetoed (its two arms, whether or
not a step it let draft found anything to draft: policy.py ``record_step``), per batch-size bucket
(powers of two), and vetoes drafting in a bucket where plain steps are faster (an epsilon-greedy
two-armed bandit, Sutton & Barto 2018, sec. 2.2):

- A new bucket explores until both arms are measured: a drafting probe, a plain step, again.
- After that, when a probe is due, the other arm is probed: ``probe_steps`` steps (4) for
  drafting, one for plain. The probe's figure (its recorded steps' tokens over their seconds)
  replaces that arm's stale one, so both stay current as the load and the requests' acceptance
  change. Three measured steps, not one: where only some steps find drafts (n-gram), one
  step's figure is a coin toss.
- A step the gate lets draft right after one it vetoed is a *switch* and is not recorded
  (``record``'s ``switch``): the proposer first catches up on the plain steps and drafts from
  scratch (H200, MTP at batch 1: 5.3-5.8 ms, against ~2.7 ms for a drafting step that follows
  another and 1.26 ms for a plain step). Weighed as the drafting arm's rate, no single-step
  probe could ever lift a veto even at 100% acceptance (4 tokens in 5.5 ms < 1 in 1.26 ms).
  The probe's later steps are what measures drafting; the switch is paid once per run of
  drafting steps.
- A probe that confirms the choice doubles the bucket's interval to the next probe, up to
  ``max_probe_every`` (4 x by default); one that overturns it resets the interval (exponential
  backoff). On the H200 a drafting probe at 64 requests whose drafts were all rejected cost 20 ms
  against 4.4 ms for a plain step, and one in 32 steps made the MTP server 0.80x plain decoding
  there. The cap bounds how late a request that would gain is found (128 steps by default: a
  cap of 16 x left most simulated 128-token requests that accept every draft undrafted).
- Past that cap, a drafting probe that lost is spaced so that what it cost stays within
  ``probe_budget`` (3%) of the bucket's plain decoding time: its steps' seconds (the switch
  included) less the time plain steps take to emit the same tokens, over ``probe_budget`` x a
  plain step's seconds, is the least interval to the next probe. At batch 1 a lost 4-step MTP
  probe costs ~8.3 ms (5.5 + 3 x 2.6 ms against 4 x 1.26), so the next comes after ~220 steps;
  at 64 requests its switch cost ~30-70 ms against 4.4 ms plain steps (H200, session 12: the
  MTP server 0.87x plain decoding there with every draft rejected), so probes come ~500-1000
  steps apart.
- A new bucket whose nearest smaller measured bucket vetoes drafting starts from that bucket's
  figures instead of exploring: a verify step's relative cost only grows with the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class _Bucket:
    tokens: dict = field(default_factory=dict)   # True (drafting) / False (plain) -> weighted
    seconds: dict = field(default_factory=dict)  # mean tokens of a step, and seconds of a step
    count: dict = field(default_factory=dict)    # steps recorded per arm
    steps: int = 0
    probe: bool | None = None   # the arm being probed (allow()), until its last step is recorded
    probe_n: int = 0            # the probe's steps recorded so far
    interval: int = 0           # steps from one probe to the next (0: not set yet)
    next_probe: int = 0         # the step (count of allow() calls) that probes next
    probe_step: int = 0         # the step of the last probe
    burst: int = 0              # drafting steps still to allow for the probe
    explored: bool = False      # the arm of the last exploring probe (drafting goes first)
    probe_loss: float = 0.0     # seconds the drafting probe in flight cost over plain steps

    @property
    def rate(self) -> dict:
        """Per measured arm: tokens/s, its mean tokens over its mean seconds."""
        return {arm: t / self.seconds[arm] for arm, t in self.tokens.items()}


class LoadGate:
    """Per batch-size bucket: exponentially weighted tokens/s of drafting and of plain steps.

    Args:
        probe_every: one step in this many takes the arm the gate would not choose (at least 2 x
            ``probe_steps``; ``probe_steps`` steps for drafting), as long as probes overturn the
            choice; each probe that confirms it doubles the interval, up to ``max_probe_every``
            (default 4 x ``probe_every``);
        decay: weight of the old figure when a step of the same arm is recorded (0..1);
        probe_budget: the most a lost drafting probe may cost, as a fraction of the plain
            decoding time until the next one (module doc), up to ``64 x probe_every`` steps;
        probe_steps: steps a drafting probe runs (>= 2: the first is a switch, the others are
            its measure, their tokens over their seconds).
    """

    def __init__(self, probe_every: int = 32, decay: float = 0.9,
                 max_probe_every: int | None = None, probe_budget: float = 0.03,
                 probe_steps: int = 4):
        if probe_steps < 2:
            raise ValueError(f"probe_steps must be at least 2, got {probe_steps}")
        if probe_every < 2 * probe_steps:   # else a drafting probe that wins is probed back
            raise ValueError(f"probe_every must be at least 2 x probe_steps ({probe_steps}), "
                             f"got {probe_every}")
        if probe_budget <= 0:
            raise ValueError(f"probe_budget must be positive, got {probe_budget}")
        self.probe_every, self.decay, self.probe_budget = probe_every, decay, probe_budget
        self.probe_steps = probe_steps
        self.max_probe_every = max(probe_every, max_probe_every or 4 * probe_every)
        self._buckets: dict[int, _Bucket] = {}

    @staticmethod
    def bucket(num_seqs: int) -> int:
        """Bucket of a batch of ``num_seqs`` sequences: 1; 2; 3-4; 5-8; ...; 33-64; ..."""
        return max(0, num_seqs - 1).bit_length()

    def _get(self, num_seqs: int) -> _Bucket:
        """``num_seqs``'s bucket. A new one starts from the figures of the largest smaller
        bucket with both arms measured if drafting lost there: a verify step's relative cost
        only grows with the batch (``DraftLengthPolicy``), so drafting loses here too, and
        exploring costs drafting steps per bucket as a load ramps up (H200, MTP at 64 requests
        with every draft rejected: 20 ms against 4.4 ms for a plain step). Each inherited
        figure counts as no step, so the bucket's first step of that arm replaces it; the
        drafting arm is probed after ``probe_every`` steps, as in any bucket."""
        key = self.bucket(num_seqs)
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket()
            measured = [k for k, o in self._buckets.items() if k < key and len(o.rate) == 2]
            if measured:
                near = self._buckets[max(measured)]
                if near.rate[True] < near.rate[False]:
                    b.tokens, b.seconds = dict(near.tokens), dict(near.seconds)
        return b

    def allow(self, num_seqs: int) -> bool:
        """Whether the step about to run with ``num_seqs`` decoding sequences may draft."""
        b = self._get(num_seqs)
        b.steps += 1
        if not b.interval:
            b.interval = b.next_probe = self.probe_every
        if b.burst:
            b.burst -= 1
            return True
        if b.probe is True:   # a drafting probe whose last step was not recorded (a prefill
            self._close_probe(b, num_seqs)   # chunk in it, no tokens, another bucket's size)
        due = b.steps >= b.next_probe
        if due:
            b.next_probe = b.steps + b.interval
        spec, plain = b.rate.get(True), b.rate.get(False)
        if spec is None or plain is None:   # explore: drafting and plain probes in turn until
            b.explored = not b.explored     # both are measured (steps with prefill chunks are
            return self._start_probe(b, b.explored, num_seqs)   # not recorded: never lock in)
        choice = spec >= plain
        return self._start_probe(b, not choice, num_seqs) if due else choice

    def _start_probe(self, b: _Bucket, arm: bool, num_seqs: int) -> bool:
        """Probe ``arm`` from this step: ``probe_steps`` steps for drafting, one plain. A
        probe still open (its last step unrecorded) is closed first."""
        if b.probe is not None:
            self._close_probe(b, num_seqs)
        b.probe, b.probe_n, b.probe_step, b.probe_loss = arm, 0, b.steps, 0.0
        b.burst = self.probe_steps - 1 if arm else 0
        return arm

    def _close_probe(self, b: _Bucket, num_seqs: int) -> None:
        """End the probe in flight: back off on what its recorded steps said, if any did."""
        probed, b.probe = b.probe, None
        if b.probe_n:
            self._back_off(b, probed, num_seqs)
        b.probe_n, b.probe_loss = 0, 0.0

    def exploring(self, num_seqs: int) -> bool:
        """Whether the step ``allow`` just let draft with ``num_seqs`` sequences is there to
        measure drafting (the drafting arm not measured yet, or a probe of it): the policy then
        prices drafts by its model, not by measured times that may have gone stale."""
        b = self._buckets.get(self.bucket(num_seqs))
        return b is not None and (b.probe is True or True not in b.rate)

    def record(self, num_seqs: int, drafted: bool, tokens: int, seconds: float,
               switch: bool = False) -> None:
        """A decode step of ``num_seqs`` sequences emitted ``tokens`` tokens in ``seconds``
        (the engine's wall time from the previous step's end: drafting, forward,
        verification, output); ``drafted``: the gate let it draft. ``switch``: it let this
        step draft and vetoed the one before (not recorded: see the module doc)."""
        if seconds <= 0 or tokens <= 0:
            return
        b = self._get(num_seqs)
        plain = b.rate.get(False)
        if drafted and b.probe is True and plain:   # the probe's cost, switch too
            b.probe_loss += seconds - tokens / plain
        if drafted and switch:
            return
        n = b.count[drafted] = b.count.get(drafted, 0) + 1
        # a plain mean over the first steps (one slow first step must not decide for long), then
        # exponential forgetting, of tokens and of seconds: their ratio weighs each step by its
        # time, as the requests wait it (a mean of per-step rates would let a fast step with
        # many accepted drafts outweigh slow ones). A probe's steps replace their arm's
        # figure with their own mean: it is stale by then (the requests and their acceptance
        # may have changed since: blended in, one probe in 32 took ~100 steps to lift a veto
        # learned from a request that accepted nothing). Only a step of the probed arm takes
        # part: under async scheduling the plain step still in flight is recorded first, when
        # the drafting probe drains it.
        probe = b.probe == drafted
        if probe:
            b.probe_n += 1
            w = 1.0 / b.probe_n
        else:
            w = max(1.0 / n, 1.0 - self.decay)
        mean_t = b.tokens.get(drafted, 0.0)
        mean_s = b.seconds.get(drafted, 0.0)
        b.tokens[drafted] = mean_t + w * (tokens - mean_t)
        b.seconds[drafted] = mean_s + w * (seconds - mean_s)
        if probe and not b.burst:   # the probe's last step
            self._close_probe(b, num_seqs)

    def _back_off(self, b: _Bucket, probed: bool, num_seqs: int) -> None:
        """After a probe of the arm ``probed`` was recorded: double the interval to the next
        probe if the other arm is still the faster, and for a lost drafting probe keep its
        cost within ``probe_budget`` of the plain steps until the next (module doc); else go
        back to ``probe_every``."""
        rate = b.rate
        other = rate.get(not probed)
        confirmed = other is not None and rate[probed] < other
        b.interval = (min(2 * b.interval, self.max_probe_every) if confirmed
                      else self.probe_every)
        if confirmed and probed and b.probe_loss > 0:
            plain_step = num_seqs / other   # seconds of a plain step: one token per sequence
            paid = math.ceil(b.probe_loss / (self.probe_budget * plain_step))
            b.interval = max(b.interval, min(paid, 64 * self.probe_every))
        b.probe_loss = 0.0
        b.next_probe = b.probe_step + b.interval

    def rates(self, num_seqs: int) -> tuple[float | None, float | None]:
        """(drafting, plain) tokens/s measured in ``num_seqs``'s bucket (None: not yet)."""
        b = self._buckets.get(self.bucket(num_seqs), _Bucket())
        rate = b.rate
        return rate.get(True), rate.get(False)
