"""The interface every speculative proposer implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from mtpserve.engine.sequence import Sequence
from mtpserve.spec.policy import DraftLengthPolicy


class Proposer(ABC):
    """Drafts tokens for running sequences before each engine step.

    :meth:`propose` decides each sequence's draft budget — at most k, no further than max_tokens
    and max_model_len allow, and, with a ``policy``, only as many as pay for themselves — and
    calls :meth:`draft`, which sets ``seq.draft_token_ids`` (up to the budget) and
    ``seq.draft_probs`` ([len(drafts), vocab] float32: the proposal distribution q of a sampling
    proposer, or None for a deterministic one). The engine then verifies every sequence's drafts
    in one forward pass of the target and reports back through :meth:`record`.
    """

    def __init__(self, num_steps: int, policy: DraftLengthPolicy | None = None):
        self.k = num_steps
        self.policy = policy

    def propose(self, seqs: list[Sequence]) -> None:
        """Fill in drafts for ``seqs`` (each has exactly one token without K/V: its newest)."""
        work = []
        allowed = True
        if self.policy is not None:
            self.policy.set_batch(len(seqs))
            allowed = self.policy.allow_drafts()
        for seq in seqs:
            seq.draft_token_ids, seq.draft_probs = [], None
            if not allowed:
                continue
            budget = min(self.k, seq.room_for_drafts)
            if budget and self.policy is not None:
                budget = min(budget, self.policy.num_drafts(seq))
            if budget:
                work.append((seq, budget))
        if work:
            self.draft(work)

    @abstractmethod
    def draft(self, work: list[tuple[Sequence, int]]) -> None:
        """Draft up to ``budget`` tokens for each ``(seq, budget)``."""

    def record(self, seq: Sequence, num_drafts: int, num_accepted: int) -> None:
        """A verify step of ``seq`` accepted ``num_accepted`` of ``num_drafts`` drafts."""
        if self.policy is not None:
            self.policy.record(seq, num_drafts, num_accepted)

    def observe(self, items: list[tuple[Sequence, int, torch.Tensor]]) -> None:
        """After a step, per running sequence: (first position, the target's hidden states
        [n, H] of the n positions from there that the step computed and kept). For MTP-style
        proposers, which draft from the target's hidden states."""

    def release(self, seq: Sequence) -> None:
        """``seq`` finished or was aborted: drop any state kept for it."""
        if self.policy is not None:
            self.policy.forget(seq)
