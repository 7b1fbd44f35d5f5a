"""Test proposers that put the verifier on known paths.

- forced-accept: proposes exactly the target's own greedy continuation (the target's weights
  draft for themselves, greedily), so every draft of a greedy request is accepted and stops,
  EOS and limits fall inside accepted blocks;
- forced-reject: proposes a token that is certainly not the target's greedy choice (the greedy
  token + 1, never 0), so every draft is rejected: the zero-accept path.
"""

from __future__ import annotations

from mtpserve.engine.model_runner import ModelRunner
from mtpserve.engine.sequence import Sequence
from mtpserve.spec.draft_model import DraftModelProposer


class ForcedAcceptProposer(DraftModelProposer):
    """Greedy self-drafting with the target's weights (its own KV pool)."""

    def __init__(self, num_steps: int, runner: ModelRunner, eos_token_ids: tuple[int, ...]):
        super().__init__(num_steps, runner, runner.model_config.vocab_size, eos_token_ids,
                         greedy_only=True)


class ForcedRejectProposer(ForcedAcceptProposer):
    """Every draft is a valid, non-zero token id other than the target's greedy choice."""

    def draft(self, work: list[tuple[Sequence, int]]) -> None:
        super().draft(work)
        vocab = self.runner.model_config.vocab_size
        for seq, _ in work:
            seq.draft_token_ids = [t + 1 if t + 1 < vocab else 1 for t in seq.draft_token_ids]
