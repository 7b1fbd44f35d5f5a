"""Host time per scheduled token, learned from the engine's own steps.

A step's wall time is the device time of its forward (on CUDA: the measured replay time of the
graph it used) plus host work that grows with its tokens: proposing drafts, building inputs,
verifying, appending and detokenizing. The speculation policy prices a verify step with both;
ignoring the host part made n-gram drafting at 64 concurrent requests slower than none.
"""

from __future__ import annotations


class StepTimer:
    """Exponentially weighted host seconds per scheduled token (0 until a step is measured)."""

    def __init__(self, decay: float = 0.9):
        self.decay = decay
        self.host_per_token = 0.0
        self._seen = False

    def record(self, num_tokens: int, wall: float, device: float | None) -> None:
        """A step of ``num_tokens`` tokens took ``wall`` seconds, ``device`` of them on the
        device (None: unknown, nothing learned)."""
        if device is None or num_tokens <= 0:
            return
        sample = max(0.0, wall - device) / num_tokens
        if not self._seen:
            self.host_per_token, self._seen = sample, True
        else:
            self.host_per_token = self.decay * self.host_per_token + (1 - self.decay) * sample
