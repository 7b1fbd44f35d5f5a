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


class NgramIndex:
    """Incremental version of :func:`ngram_lookup` for one growing sequence: for each n, a hash
    map from an n-gram to the latest start at which it is followed by a token. Each new token
    adds n_max - n_min + 1 entries, and a lookup is n_max - n_min + 1 probes, whatever the
    length (the whole-array scan costs O(length) per step, which at 64 sequences dominated a
    GPU step)."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(n_min, n_max + 1)}
        self.indexed = 0   # tokens[:indexed] have had their windows (those with a successor) added

    def update(self, tokens: list[int]) -> None:
        """Index every window of ``tokens`` that ends before the last token.

        The new windows of each n go in with one ``dict.update`` over ``zip`` of n shifted
        slices: a later start overwrites an earlier one, as the latest occurrence must. A
        catch-up of 1000 tokens (a prompt, or the steps the proposer skipped) costs ~0.3 ms
        where a loop over windows took ~1.3 ms (CPU, n = 1..4): at 64 requests a drafting step
        after 64 plain ones indexes ~4000 tokens."""
        last = len(tokens) - 1        # a window must be followed by a token
        first = max(self.indexed, 1)  # the first window end not indexed yet (end: exclusive)
        if last - first < 4:          # a step's few tokens: the slices would cost more
            for end in range(first, last + 1):
                for n, m in self.maps.items():
                    if end >= n:
                        m[tuple(tokens[end - n:end])] = end - n
            self.indexed = max(self.indexed, last + 1)
            return
        for n, m in self.maps.items():
            lo = max(first, n)        # windows tokens[end - n:end] for end in lo..last
            if lo <= last:
                cols = [tokens[lo - n + j:last - n + 1 + j] for j in range(n)]
                m.update(zip(zip(*cols), range(lo - n, last - n + 1)))
        self.indexed = max(self.indexed, last + 1)

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        self.update(tokens)
        L = len(tokens)
        for n in range(min(self.n_max, L - 1), self.n_min - 1, -1):
            start = self.maps[n].get(tuple(tokens[L - n:]))
            if start is not None:
                return tokens[start + n:start + n + k]
        return []


class NgramProposer(Proposer):
    """Deterministic drafts (one-hot q): the continuation of the longest recent n-gram match."""

    skips_steps = True   # the index catches up on the tokens whenever it drafts

    def __init__(self, num_steps: int, ngram_min: int, ngram_max: int, policy=None):
        super().__init__(num_steps, policy)
        self.n_min, self.n_max = ngram_min, ngram_max
        self.index: dict[str, NgramIndex] = {}

    def draft(self, work: list[tuple[Sequence, int]]) -> None:
        for seq, budget in work:
            idx = self.index.get(seq.request_id)
            if idx is None:
                idx = self.index[seq.request_id] = NgramIndex(self.n_min, self.n_max)
            seq.draft_token_ids = idx.lookup(seq.token_ids, budget)

    def release(self, seq: Sequence) -> None:
        super().release(seq)
        self.index.pop(seq.request_id, None)
