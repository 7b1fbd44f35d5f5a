"""Speculative sampling of one-hot drafts on the device (spec/sampled_ahead.py) against the
host's verification (spec/verify.py, whose output distribution test_spec_verify.py checks):
with the same generators, every trial emits the same tokens, and a rejected draft is never the
token emitted in its place."""

from __future__ import annotations

import pytest
import torch

from mtpserve.engine.sampler import Sampler, SamplingRow
from mtpserve.sampling_params import SamplingParams
from mtpserve.spec.sampled_ahead import sample_targets
from mtpserve.spec.verify import VerifyInput, verify

V = 8


def logits_rows() -> torch.Tensor:
    """[4, V]: each row puts about half its mass on one token (the draft below), the rest
    spread, so drafts get accepted and rejected about evenly."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, V, generator=g) * 0.5
    for row, tok in enumerate([2, 5, 1, 6]):
        x[row, tok] += 2.0
    return x


def items(params: list[SamplingParams], seeds: list[int | None]) -> list[VerifyInput]:
    """Three sequences over one logits tensor [9, V]: 3 drafts, 1 draft, none (a prefill-end
    or budget-0 row); each with its own generator (seeded) or the shared one (None)."""
    drafts = [[2, 5, 1], [2], []]
    out, first = [], 0
    for d, p, seed in zip(drafts, params, seeds):
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        rows = [SamplingRow(p, gen, [0], [], ()) for _ in range(len(d) + 1)]
        out.append(VerifyInput(rows, first, d, None))
        first += len(d) + 1
    return out


def logits_all() -> torch.Tensor:
    x = logits_rows()
    return torch.cat([x, x[:2], x[:1], torch.zeros(2, V)])[:9]   # a row past the items: zeros


@pytest.mark.parametrize("truncate", [dict(), dict(top_k=4), dict(top_p=0.8),
                                      dict(min_p=0.2)])
def test_device_targets_emit_the_host_verification_tokens(truncate):
    params = [SamplingParams(temperature=0.9, **truncate), SamplingParams(temperature=1.2),
              SamplingParams(temperature=0.7, **truncate)]
    logits = logits_all()[:7]
    rejected = 0
    for trial in range(150):
        seeds = [1000 + trial, None, 3000 + trial]
        host = verify(Sampler(V, seed=trial), logits, items(params, seeds))
        targets = torch.full((7,), -1, dtype=torch.int64)
        dev_items = items(params, seeds)
        sample_targets(Sampler(V, seed=trial), logits, targets, dev_items)
        for it, res in zip(dev_items, host):
            t = targets[it.first_row:it.first_row + len(it.rows)].tolist()
            a = res.num_accepted
            # the longest prefix of drafts equal to the targets is the host's acceptance, and
            # the targets up to it are the host's tokens
            assert t[:a + 1] == res.token_ids
            assert t[:a] == it.drafts[:a]
            if a < len(it.drafts):
                assert t[a] != it.drafts[a]
                rejected += 1
            assert t[a + 1:] == [t[a]] * (len(t) - a - 1)
    assert rejected >= 100


def test_a_sequence_whose_rows_are_all_past_the_items_is_left_alone():
    logits = logits_all()
    targets = torch.arange(9)
    params = [SamplingParams(temperature=1.0)] * 3
    its = items(params, [1, 2, 3])[:1]            # only the first sequence's 4 rows
    sample_targets(Sampler(V), logits, targets, its)
    assert targets[4:].tolist() == [4, 5, 6, 7, 8]
    sample_targets(Sampler(V), logits, targets, [])   # nothing to do
    assert targets[4:].tolist() == [4, 5, 6, 7, 8]


def test_drafts_outside_top_k_and_drafts_holding_all_the_mass():
    """Edge rows of speculative sampling with one-hot drafts, on the device path against the
    host's: a draft that top-k excludes (p = 0) is always rejected and the token emitted in its
    place is drawn from p (never the draft); a draft that holds all of p's mass (top_k=1 at
    its argmax, or a temperature of 1e-5) is always accepted. Every trial equals the host."""
    x = logits_rows()              # row r: token [2, 5, 1, 6][r] leads; top 2 of row 0: 2, 1
    logits = torch.cat([x, x[:2], x[:1], x[:2]])          # 9 rows for the items below
    cases = [  # (params, drafts per item): item rows 0-3, 4-5, 6, 7-8
        (SamplingParams(temperature=1.0, top_k=2), [[0, 3, 7], [3], [], [4]]),   # p(d0) = 0
        (SamplingParams(temperature=1.0, top_k=1), [[2, 5, 1], [2], [], [2]]),   # all p = 1
        (SamplingParams(temperature=1e-5), [[2, 5, 1], [2], [], [2]]),
    ]
    for params, drafts in cases:
        emitted = []
        for trial in range(40):
            def make():
                out, first = [], 0
                for j, d in enumerate(drafts):
                    gen = torch.Generator().manual_seed(100 * trial + j) if j % 2 else None
                    out.append(VerifyInput([SamplingRow(params, gen, [0], [], ())
                                            for _ in range(len(d) + 1)], first, d, None))
                    first += len(d) + 1
                return out
            host = verify(Sampler(V, seed=trial), logits, make())
            targets = torch.full((9,), -1, dtype=torch.int64)
            dev_items = make()
            sample_targets(Sampler(V, seed=trial), logits, targets, dev_items)
            for it, res in zip(dev_items, host):
                t = targets[it.first_row:it.first_row + len(it.rows)].tolist()
                assert t[:res.num_accepted + 1] == res.token_ids
                emitted.append((it.drafts, res.num_accepted, res.token_ids))
        if params.top_k == 2:     # p(draft) = 0: rejected at once, the replacement is not it
            assert all(a == 0 and (not d or toks[0] != d[0]) for d, a, toks in emitted)
            assert {toks[0] for d, _, toks in emitted} == {2, 1}   # row 0's top 2 (x[0])
        else:                     # p(draft) = 1: every draft accepted, then p's argmax
            assert all(a == len(d) for d, a, _ in emitted)
            assert all(toks[-1] == [2, 5, 1, 6][len(d)] if len(d) < 3 else toks[-1] == 6
                       for d, _, toks in emitted if d in ([2, 5, 1], [2]))


def test_device_path_emits_the_target_distribution():
    """The first token emitted by the device path (draft accepted, or the residual's draw) is
    distributed as p at row 0 (top-k 5, temperature 0.8), also with a draft p excludes."""
    from scipy.stats import chisquare

    x = logits_rows()[:2]
    params = SamplingParams(temperature=0.8, top_k=5)
    sampler = Sampler(V)
    p0 = sampler.probs(x[:1], [SamplingRow(params)])[0]
    excluded = int(p0.argmin())
    for draft in (2, excluded):
        counts = torch.zeros(V)
        gen = torch.Generator().manual_seed(7 + draft)
        n = 6000
        for _ in range(n):
            targets = torch.zeros(2, dtype=torch.int64)
            rows = [SamplingRow(params, gen, [0], [], ()) for _ in range(2)]
            sample_targets(sampler, x, targets, [VerifyInput(rows, 0, [draft], None)])
            counts[int(targets[0])] += 1
        keep = p0 > 0
        assert counts[~keep].sum() == 0
        expected = (p0[keep] * n).double().numpy()
        assert chisquare(counts[keep].double().numpy(), expected * (n / expected.sum())).pvalue \
            > 1e-3
