"""The interface every speculative proposer implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from mtpserve.engine.sequence import Sequence


class Proposer(ABC):
    """Drafts tokens for running sequences before each engine step.

    ``propose`` sets, for each sequence it is given, ``seq.draft_token_ids`` (0 to
    ``min(k, seq.room_for_drafts)`` tokens) and ``seq.draft_probs`` ([len(drafts), vocab] float32,
    the proposal distribution q of a sampling proposer, or None for a deterministic one). The
    engine then verifies every sequence's drafts in one forward pass of the target.
    """

    def __init__(self, num_steps: int):
        self.k = num_steps

    @abstractmethod
    def propose(self, seqs: list[Sequence]) -> None:
        """Fill in drafts for ``seqs`` (each has exactly one token without K/V: its newest)."""

    def observe(self, seqs: list[Sequence], hidden: torch.Tensor, layout) -> None:
        """After a step: the target's hidden states [T, H] (for MTP-style proposers)."""

    def release(self, seq: Sequence) -> None:
        """``seq`` finished, was aborted or preempted: drop any state kept for it."""

    def budget(self, seq: Sequence) -> int:
        return min(self.k, seq.room_for_drafts)
