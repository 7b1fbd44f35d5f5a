"""Draft acceptance learned across requests: where each new request's own estimate starts, and
which new requests sit out speculation altogether.

The draft-length policy (policy.py) learns each request's acceptance from its own verify steps,
starting from a fixed prior. A proposer whose drafts are rarely accepted (an MTP layer that does
not match the model or the domain, an n-gram proposer on open chat) then costs every new request
its first verify steps, and an MTP proposer costs more: it observes every position of every
request (spec/mtp.py), so that any of them could draft later. On the H200 an MTP server whose
drafts were all rejected ran 10-16% slower than plain decoding at 16-64 concurrent requests
(BENCHMARKS.md, session 13), most of it that upkeep.

So the evidence of all verify steps is pooled here, with exponential forgetting, and a new request
starts from the pooled estimate (an empirical-Bayes prior: the configured prior with a pseudo-count,
plus the pooled successes and trials). A request that starts where no draft length pays, at the
lower of batch 1's price and the step's (policy.py ``priced_out``: measured where they are), is
*benched*: it never drafts, and the MTP never observes it. One priced-out start in ``scout_every``
goes out as a *scout* instead, from the configured prior, so that the pooled estimate keeps learning
and speculation comes back when the drafts get better. A scout whose own evidence ends priced out
confirms the bench, and the next one comes twice as many starts later, up to ``max_scout_every``;
one that found drafts paying brings the interval back to ``scout_every`` (exponential backoff, as
the load gate's probes: load_gate.py); one that never verified a draft (too short or aborted) leaves
the interval as it is. A scout drafts even on steps the load gate vetoes, until its first verify
(policy.py ``allow_drafts``): else, once the pool is priced out and the gate vetoes, nothing would
draft and neither would ever hear that drafts pay again. Each scout costs its batch a few
synchronous drafting steps. When the configured prior is priced out at the cost model's price (the
one an open scout drafts at), nothing can draft and there are no scouts.
"""

from __future__ import annotations


class SharedAcceptance:
    """Pooled acceptance evidence of all requests' verify steps.

    Args:
        decay: weight of the old evidence when a verify step is recorded (0..1; 0.99 keeps
            about the last 100 steps' worth);
        scout_every: one priced-out start in this many drafts anyway (>= 1), at first and
            after a scout that found drafts paying; max_scout_every: the longest interval
            (default 16 x ``scout_every``).

    Raises:
        ValueError: ``decay`` outside [0, 1] or ``scout_every`` < 1.
    """

    def __init__(self, decay: float = 0.99, scout_every: int = 8,
                 max_scout_every: int | None = None):
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        if scout_every < 1:
            raise ValueError(f"scout_every must be at least 1, got {scout_every}")
        self.decay, self.scout_every = decay, scout_every
        self.max_scout_every = max(scout_every, max_scout_every or 16 * scout_every)
        self.successes = self.trials = 0.0
        self.interval = scout_every        # priced-out starts from one scout to the next
        self._until_scout = scout_every
        self.num_benched = self.num_scouts = 0   # requests started each way (for /metrics)

    def record(self, num_drafts: int, num_accepted: int) -> None:
        """A verify step of ``num_drafts`` (> 0) drafts accepted ``num_accepted``: the same
        truncated-geometric count as a request's own (policy.py)."""
        d = self.decay
        self.successes = d * self.successes + num_accepted
        self.trials = d * self.trials + num_accepted + (1 if num_accepted < num_drafts else 0)

    def estimate(self, prior: float, weight: float) -> float:
        """Acceptance per draft: ``prior`` with ``weight`` pseudo-trials, plus the evidence."""
        return (prior * weight + self.successes) / (weight + self.trials)

    def scout(self, can_draft: bool = True) -> bool:
        """Count one priced-out start; True for every ``interval``-th (it drafts anyway),
        False for the others (benched). ``can_draft`` False (the configured prior is priced
        out too, so a scout could not draft either): benched, the countdown left as it is."""
        if not can_draft:
            self.num_benched += 1
            return False
        self._until_scout -= 1
        scout = self._until_scout <= 0
        if scout:
            self.num_scouts += 1
            self._until_scout = self.interval
        else:
            self.num_benched += 1
        return scout

    def snapshot(self) -> dict:
        """Everything this holds (evidence, countdown, counters), for :meth:`restore`."""
        return dict(vars(self))

    def restore(self, state: dict) -> None:
        """Back to a :meth:`snapshot` (the engine's internal warm-up request leaves no trace)."""
        vars(self).update(state)

    def scout_done(self, drafts_pay: bool) -> None:
        """A scout finished with evidence (it verified drafts): its own acceptance paid (back to
        ``scout_every``) or was priced out (the interval doubles, up to ``max_scout_every``).
        The countdown to the next scout is shortened or stretched to the new interval."""
        old = self.interval
        self.interval = (self.scout_every if drafts_pay
                         else min(2 * self.interval, self.max_scout_every))
        self._until_scout = max(1, self._until_scout + self.interval - old)
