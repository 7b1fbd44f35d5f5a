"""N-gram (prompt lookup) proposer: copy what followed the last time the recent tokens appeared.

Prompt lookup decoding (Saxena 2023; vLLM's ``ngram``): find the longest suffix of the sequence,
between ``ngram_max`` and ``ngram_min`` tokens, that occurred earlier in prompt + output, and
propose the k tokens that followed its most recent earlier occurrence. No weights, no state; it
shines when the output copies from the input (code edits, summaries with quotes, repetitive text).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from mtpserve.engine.sequence import Sequence
from mtpserve.spec.proposer import Proposer


def ngram_lookup(tokens: np.ndarray, n_min: int, n_max: int, k: int) -> list[int]:
    """Draft up to ``k`` tokens for the int64 array ``tokens`` [L] (empty list: no match).

    Tries n = n_max down to n_min; for the first n whose suffix ``tokens[L-n:]`` occurs earlier,
    returns the tokens after its latest earlier occurrence.
    """
    L = len(tokens)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        windows = sliding_window_view(tokens[: L - 1], n)   # start i covers tokens[i:i+n]
        hits = np.flatnonzero((windows == tokens[L - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramProposer(Proposer):
    """Deterministic drafts (one-hot q) from :func:`ngram_lookup`."""

    def __init__(self, num_steps: int, ngram_min: int, ngram_max: int, policy=None):
        super().__init__(num_steps, policy)
        self.n_min, self.n_max = ngram_min, ngram_max

    def draft(self, work: list[tuple[Sequence, int]]) -> None:
        for seq, budget in work:
            tokens = np.asarray(seq.token_ids, dtype=np.int64)
            seq.draft_token_ids = ngram_lookup(tokens, self.n_min, self.n_max, budget)
