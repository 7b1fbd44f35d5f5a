"""How many draft tokens a request should verify this step, so that speculation never costs more
than it saves.

Model (Leviathan et al. 2023, sec. 3.3): if each draft token is accepted with probability a
independently, verifying m drafts emits E(m) = (1 - a^(m+1)) / (1 - a) tokens, and the step costs
C(m) = 1 + (alpha + beta) * m decode steps, where alpha is the target's extra cost per verified
token (small when decoding is memory-bound) and beta the proposer's cost per draft. The policy
picks the m in 0..k that maximises E(m) / C(m); m = 0 means plain decoding.

a is estimated per request from its own verify steps with exponential forgetting: each step that
verified m drafts and accepted j adds j successes out of j + (1 if j < m else 0) trials (the
maximum-likelihood count for a truncated geometric). Before any evidence the estimate starts at
``prior``; while a request does not draft, its estimate slowly returns to the prior, so that it
tries again later.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpserve.engine.sequence import Sequence


@dataclass
class _Estimate:
    successes: float
    trials: float


class DraftLengthPolicy:
    """Per-request draft length.

    Args:
        k: most drafts per step. cost_per_draft: alpha + beta above (in decode steps).
        prior: starting acceptance estimate; prior_weight: its weight in trials;
        decay: forgetting factor per verify step.
    """

    def __init__(self, k: int, cost_per_draft: float, prior: float = 0.6,
                 prior_weight: float = 2.0, decay: float = 0.8):
        self.k, self.cost = k, cost_per_draft
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self._est: dict[str, _Estimate] = {}

    def acceptance(self, seq: Sequence) -> float:
        e = self._est.get(seq.request_id)
        return self.prior if e is None else e.successes / e.trials

    def num_drafts(self, seq: Sequence) -> int:
        """Best m in 0..k for this request now."""
        a = min(self.acceptance(seq), 0.999)
        best, best_rate = 0, 1.0
        for m in range(1, self.k + 1):
            rate = (1 - a ** (m + 1)) / (1 - a) / (1 + self.cost * m)
            if rate > best_rate:
                best, best_rate = m, rate
        if best == 0:  # not drafting: drift back towards the prior so that it tries again
            self._update(seq, 0, 0, idle=True)
        return best

    def record(self, seq: Sequence, num_drafts: int, num_accepted: int) -> None:
        if num_drafts:
            self._update(seq, num_drafts, num_accepted)

    def forget(self, seq: Sequence) -> None:
        self._est.pop(seq.request_id, None)

    def _update(self, seq: Sequence, m: int, j: int, idle: bool = False) -> None:
        e = self._est.setdefault(seq.request_id, _Estimate(self.prior * self.prior_weight,
                                                           self.prior_weight))
        if idle:
            w = 1 - self.decay ** 0.25
            e.successes += w * (self.prior * e.trials - e.successes)
            return
        e.successes = self.decay * e.successes + j
        e.trials = self.decay * e.trials + j + (1 if j < m else 0)
