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
    in one forward pass of the target and reports back through :meth:`record`. A proposer may
    leave its drafts on the device (MTP's greedy chain): ``draft_token_ids`` then hold
    placeholders of the right count until :meth:`resolve_drafts`, and :meth:`patch_inputs`
    puts the real ids into the verify batch.
    """

    # True when skipping a step leaves nothing behind (the proposer reads only the tokens when
    # it drafts): the engine may then overlap the steps the policy keeps plain (overlap.py).
    skips_steps = False
    # True when the proposer can follow a plain step that the host has not read back yet
    # (:meth:`observe_launched`, MTP): such steps overlap too when nothing drafts.
    observes_launched = False

    def __init__(self, num_steps: int, policy: DraftLengthPolicy | None = None):
        self.k = num_steps
        self.policy = policy

    def allow_drafts(self, num_seqs: int) -> bool:
        """The policy's say (once per step) on whether a step of ``num_seqs`` decoding sequences
        may draft at all."""
        if self.policy is None:
            return True
        self.policy.set_batch(num_seqs)
        return self.policy.allow_drafts()

    def drafts_nothing(self, seqs: list[Sequence], allowed: bool) -> bool:
        """Whether :meth:`propose` would give every sequence of ``seqs`` no drafts this step
        (``allowed``: :meth:`allow_drafts`'s answer); changes nothing."""
        if not allowed:
            return True
        seqs = self._unbenched(seqs)
        return all(min(self.k, seq.room_for_drafts) == 0
                   or (self.policy is not None and self.policy.would_draft(seq) == 0)
                   for seq in seqs)

    def propose(self, seqs: list[Sequence], allowed: bool | None = None) -> None:
        """Fill in drafts for ``seqs`` (each has exactly one token without K/V: its newest);
        ``allowed``: :meth:`allow_drafts`'s answer for this step (None: ask now)."""
        work = []
        if allowed is None:
            allowed = self.allow_drafts(len(seqs))
        for seq in seqs:
            seq.draft_token_ids, seq.draft_probs = [], None
        if not allowed:
            return
        seqs = self._unbenched(seqs)
        for seq in seqs:
            budget = min(self.k, seq.room_for_drafts)
            if budget and self.policy is not None:
                budget = min(budget, self.policy.num_drafts(seq))
            if budget:
                work.append((seq, budget))
        if work:
            self.draft(work)

    def _unbenched(self, seqs: list[Sequence]) -> list[Sequence]:
        """``seqs`` less those the policy benched (spec/shared_acceptance.py), in one pass."""
        unbenched = getattr(self.policy, "unbenched", None)   # (a policy of one's own may lack it)
        return seqs if unbenched is None else unbenched(seqs)

    @abstractmethod
    def draft(self, work: list[tuple[Sequence, int]]) -> None:
        """Draft up to ``budget`` tokens for each ``(seq, budget)``."""

    def patch_inputs(self, batch, sched) -> None:
        """After ``ModelRunner.prepare``: put drafts that are still on the device into
        ``batch.input_ids`` (their host copies are placeholders; see spec/pending_drafts.py).
        Nothing for proposers whose drafts are on the host."""

    def resolve_drafts(self, sched) -> None:
        """After the step's forward is launched, before its drafts are verified: the real ids
        in place of placeholders (spec/pending_drafts.py). Nothing for host-side proposers."""

    def verify_ahead(self, sched, batch, layout, hidden: torch.Tensor, logits: torch.Tensor,
                     sampler=None, items=None):
        """Right after a verify forward is launched: a proposer that drafts from the device
        may decide the acceptance there and start its next drafts before the host reads back
        (spec/draft_ahead.py); it returns an ``AheadStep`` whose targets the engine verifies
        with. ``sampler``, ``items``: the engine's Sampler and the VerifyInputs it will verify
        (spec/verify.py; None: the step verifies nothing), for sampled rows. None (the
        default): the step goes the usual way."""
        return None

    def observe_launched(self, sched, hidden: torch.Tensor, next_ids: torch.Tensor) -> None:
        """Right after a plain step (no drafts) is launched, before the host reads it back
        (async scheduling, engine/overlap.py): per batch token, the target's hidden state
        ``hidden`` [T, H] and the id of the token after it ``next_ids`` [T] int64 (overlap.py
        ``next_token_ids``), both on the device; ``sched``: the step's schedule, its
        sequences' ``num_computed_tokens`` already past the step. Only proposers with
        ``observes_launched``."""
        raise NotImplementedError

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
