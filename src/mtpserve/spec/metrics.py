"""Engine-wide speculative-decoding counters (read by /metrics and the log line)."""

from __future__ import annotations


class SpecMetrics:
    """Counts over all verify steps (steps with at least one draft) since start.

    ``accepted_per_step[j]`` is how many verify steps accepted exactly j drafts (0..k).
    Acceptance length = tokens emitted per verify step, bonus included
    = (accepted + steps) / steps. ``pool``: the adaptive policy's pooled acceptance
    (spec/shared_acceptance.py), whose counts of benched and scout requests are reported too;
    None without one.
    """

    def __init__(self, k: int):
        self.pool = None
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_verify_steps = 0
        self.accepted_per_step = [0] * (k + 1)

    def record(self, num_drafts: int, num_accepted: int) -> None:
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        self.num_verify_steps += 1
        self.accepted_per_step[num_accepted] += 1

    @property
    def num_benched_requests(self) -> int:
        """Requests that sat out speculation: they started where no draft paid."""
        return self.pool.num_benched if self.pool is not None else 0

    @property
    def num_scout_requests(self) -> int:
        """Requests that started priced out but from the prior, to keep the pool learning."""
        return self.pool.num_scouts if self.pool is not None else 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def acceptance_length(self) -> float | None:
        if not self.num_verify_steps:
            return None
        return (self.num_accepted_tokens + self.num_verify_steps) / self.num_verify_steps
