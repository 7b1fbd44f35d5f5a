"""Verification: greedy matching, and speculative sampling preserves the target distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from mtpserve.engine.sampler import Sampler, SamplingRow
from mtpserve.sampling_params import SamplingParams
from mtpserve.spec.ngram import ngram_lookup
from mtpserve.spec.verify import VerifyInput, verify

V = 8
ALPHA = 1e-3  # fixed seeds make every p-value deterministic; this only guards the design


def rows_for(params, n, gen):
    return [SamplingRow(params, gen, [0], [], ()) for _ in range(n)]


def test_greedy_accepts_matching_prefix_then_emits_target_token():
    logits = torch.full((4, V), -5.0)
    for pos, tok in enumerate([3, 1, 4, 1]):  # the target's argmax at each position
        logits[pos, tok] = 5.0
    sampler = Sampler(V)
    p = SamplingParams(temperature=0.0)
    cases = {(3, 1, 4): ([3, 1, 4, 1], 3), (3, 1, 5): ([3, 1, 4], 2), (2, 1, 4): ([3], 0)}
    for drafts, (tokens, accepted) in cases.items():
        (res,) = verify(sampler, logits, [VerifyInput(rows_for(p, 4, None), 0, list(drafts), None)])
        assert (res.token_ids, res.num_accepted) == (tokens, accepted)


def _target_and_q(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, generator=g) * 0.7
    q = torch.softmax(torch.randn(V, generator=g) * 2.0, dim=-1)
    return logits, q


@pytest.mark.parametrize("proposal", ["one_hot", "random_q", "q_equals_p", "q_far_from_p"])
@pytest.mark.parametrize("truncate", [dict(), dict(top_k=5), dict(top_p=0.8), dict(min_p=0.05)])
def test_speculative_sampling_matches_target_distribution(proposal, truncate):
    """First emitted token ~ p0; given the first draft was accepted, the second ~ p1."""
    logits, q_rand = _target_and_q(11)
    logits2 = logits.flip(0)                       # a different target at the second position
    params = SamplingParams(temperature=0.8, **truncate)
    sampler = Sampler(V)
    raw = torch.stack([logits, logits2, logits])   # rows for drafts d1, d2 and the bonus
    p = sampler.probs(raw, rows_for(params, 3, None))
    q_far = torch.zeros(V)
    q_far[p[0].argmin()] = 1.0                     # drafts the least likely token every time
    q = {"one_hot": None, "random_q": q_rand, "q_equals_p": p[0],
         "q_far_from_p": torch.full((V,), 1.0 / V)}[proposal]
    gen = torch.Generator().manual_seed(2024)
    first, second = np.zeros(V), np.zeros(V)
    n = 6000
    for _ in range(n):
        if q is None:
            drafts = [int(p[0].argmax()), int(p[1].argmax())]
            probs = None
        else:
            d = torch.multinomial(q, 2, replacement=True, generator=gen).tolist()
            drafts, probs = d, torch.stack([q, q])
        (res,) = verify(sampler, raw, [VerifyInput(rows_for(params, 3, gen), 0, drafts, probs)])
        first[res.token_ids[0]] += 1
        if res.num_accepted >= 1:
            second[res.token_ids[1]] += 1
    for counts, target in ((first, p[0]), (second, p[1])):
        support = target.numpy() > 0
        assert counts[~support].sum() == 0          # never a token outside the truncated set
        assert support.sum() >= 3                   # a real distribution, not a forced token
        t = target.double().numpy()[support]
        expected = t / t.sum() * counts.sum()
        assert chisquare(counts[support], expected).pvalue > ALPHA


def test_seeded_verification_is_reproducible():
    logits, q = _target_and_q(5)
    raw = torch.stack([logits] * 4)
    params = SamplingParams(temperature=1.0, seed=9)
    runs = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(9)
        out = []
        for _ in range(50):
            (res,) = verify(Sampler(V), raw, [VerifyInput(rows_for(params, 4, gen), 0,
                                                          [1, 2, 3], torch.stack([q] * 3))])
            out.append(tuple(res.token_ids))
        runs.append(out)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("tokens, k, expected", [
    ([1, 2, 3, 9, 1, 2, 3], 3, [9, 1, 2]),           # the 3-gram 1 2 3 seen before, then 9 ...
    ([5, 1, 2, 7, 8, 1, 2], 2, [7, 8]),              # falls back to the 2-gram 1 2
    ([1, 2, 4, 1, 2, 5, 0, 1, 2], 3, [5, 0, 1]),     # the most recent earlier occurrence wins
    ([1, 2, 3, 4], 3, []),                           # nothing repeats
    ([7, 7, 7, 7], 2, [7]),                          # the match at 0..2: one token follows
    ([3, 1, 2, 3], 5, [1, 2, 3]),                    # fewer than k tokens follow the match
])
def test_ngram_lookup(tokens, k, expected):
    assert ngram_lookup(np.array(tokens, dtype=np.int64), 1, 3, k) == expected


def test_incremental_ngram_index_agrees_with_the_array_scan():
    """The proposer's hash index and the numpy scan draft the same tokens at every length of
    random, repetitive sequences grown token by token, several at a time, and by catch-ups of
    10-40 tokens, from a first lookup at up to 60 tokens (n-gram ranges 1-1 to 2-4)."""
    from mtpserve.spec.ngram import NgramIndex

    rng = np.random.default_rng(0)
    for trial in range(40):
        alphabet = int(rng.integers(2, 6))
        tokens = rng.integers(0, alphabet, 160).tolist()
        n_min = int(rng.integers(1, 3))
        n_max = n_min + int(rng.integers(0, 3))
        idx, length = NgramIndex(n_min, n_max), int(rng.integers(2, 60))
        while length <= len(tokens):
            prefix = tokens[:length]
            expected = ngram_lookup(np.array(prefix, dtype=np.int64), n_min, n_max, 4)
            assert idx.lookup(prefix, 4) == expected, (trial, length)
            # mostly a step's 1-3 tokens; now and then a catch-up over skipped steps
            length += int(rng.integers(1, 4) if rng.random() < 0.8 else rng.integers(10, 40))
