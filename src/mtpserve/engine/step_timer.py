"""Host time of an engine step, learned from the engine's own steps.

A step's wall time is the device time of its forward (on CUDA: the measured replay time of the
graph it used) plus host work: per sequence (scheduling, building its inputs, sampling and
appending its token, detokenizing; an MTP proposer's observe) and per draft token on top
(proposing it, verifying it, appending what is accepted). The speculation policy prices a
verify step with both; ignoring the host part made n-gram drafting at 64 concurrent requests
slower than none, and pricing per-step host time per token instead (every token of a verify
step charged a plain step's host time per sequence) kept MTP at batch 1 from ever drafting.

Plain steps (tokens == sequences) teach the time per sequence; steps with drafts teach the time
per draft token, as what their host time leaves over the sequences' share. Until a step with
drafts is seen, drafts are taken to cost no host time (the load gate, spec/load_gate.py, vetoes
drafting where it measures whole steps slower).
"""

from __future__ import annotations


class StepTimer:
    """Exponentially weighted host seconds per sequence and per draft token (0 until
    measured)."""

    def __init__(self, decay: float = 0.9):
        self.decay = decay
        self.host_per_seq = 0.0
        self.host_per_draft = 0.0
        self._seen = {"seq": False, "draft": False}

    def record(self, num_tokens: int, num_seqs: int, wall: float, device: float | None) -> None:
        """A step of ``num_seqs`` sequences and ``num_tokens`` tokens (the drafts: the rest)
        took ``wall`` seconds, ``device`` of them on the device (None: unknown, nothing
        learned)."""
        if device is None or num_seqs <= 0 or num_tokens < num_seqs:
            return
        host = max(0.0, wall - device)
        if num_tokens == num_seqs:
            self.host_per_seq = self._mix("seq", self.host_per_seq, host / num_seqs)
        else:
            left = max(0.0, host - self.host_per_seq * num_seqs)
            self.host_per_draft = self._mix("draft", self.host_per_draft,
                                            left / (num_tokens - num_seqs))

    def host_seconds(self, num_tokens: int, num_seqs: int) -> float:
        """Predicted host seconds of a step of ``num_seqs`` sequences and ``num_tokens`` tokens."""
        return self.host_per_seq * num_seqs + self.host_per_draft * (num_tokens - num_seqs)

    def _mix(self, key: str, old: float, sample: float) -> float:
        if not self._seen[key]:
            self._seen[key] = True
            return sample
        return self.decay * old + (1 - self.decay) * sample
