"""Speculative sampling of deterministic drafts on the device, without a host sync.

For a sampled sequence with drafts d_0..d_{m-1} (one-hot proposals: the MTP's argmax) and the
target distributions p_0..p_m of its verify rows, speculative sampling (Leviathan et al. 2023,
Algorithm 1, with q one-hot at d_i) accepts d_i with probability p_i(d_i), stops at the first
rejection a < m and emits a token drawn from p_a with d_a removed (renormalised), or after m
acceptances a bonus token drawn from p_m (spec/verify.py does the same on the host).

:func:`sample_targets` does it on the device and writes, per verify row i, the token the step
emits there if the row is kept: d_i for i < a, the drawn token for i >= a. The longest prefix of
drafts equal to those targets is then exactly a, so the greedy acceptance kernel and the
observe-ahead of spec/draft_ahead.py apply unchanged, and the host verifies from these targets.
It draws from each sequence's generator in the host path's order (``torch.rand`` of m uniforms,
then one exponential race over the vocabulary), so a seeded request emits the same tokens with
the step on the device or on the host.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtpserve.engine.forward_batch import to_device
from mtpserve.engine.sampler import Sampler
from mtpserve.spec.verify import VerifyInput, _target_probs


def sample_targets(sampler: Sampler, logits: Tensor, targets: Tensor,
                   items: list[VerifyInput]) -> None:
    """Write into ``targets`` the token each of ``items``' rows emits if kept.

    Args:
        sampler: the engine's Sampler (its shared generator serves rows without their own).
        logits: [N, V] raw logits of the verify step, float32.
        targets: [N] int64 on the same device, one per logits row; the items' rows are
            overwritten.
        items: sampled sequences (``rows[0].params.greedy`` False) with one-hot drafts
            (``draft_probs`` None) and plain rows (no bias, penalties or min_tokens ban:
            ``is_plain``), in the order the host would verify them.
    """
    if not items:
        return
    dev = logits.device
    probs = _target_probs(sampler, logits, items, [it.first_row for it in items])
    rows, tokens = [], []
    for it, p in zip(items, probs):
        m = len(it.drafts)
        gen = it.rows[0].generator or sampler.default_generator(dev)
        u = torch.rand(m, generator=gen, device=dev)
        drafts = to_device(it.drafts + [0], torch.int64, dev)          # [m + 1], padded
        accepted = (u < p[:m].gather(1, drafts[:m, None]).squeeze(1)).long().cumprod(0).sum()
        t = sampler.draw(_residual_row(p, drafts, accepted, m), it.rows[:1])   # [1]
        pos = torch.arange(m + 1, device=dev)
        tokens.append(torch.where(pos < accepted, drafts, t))
        rows += [it.first_row + i for i in range(m + 1)]
    targets.index_copy_(0, to_device(rows, torch.int64, dev), torch.cat(tokens))


def _residual_row(p: Tensor, drafts: Tensor, accepted: Tensor, m: int) -> Tensor:
    """[1, V]: p at row ``accepted`` with that row's draft removed and renormalised when it was
    rejected (``accepted`` < m), else p at row m as it is (the bonus). As spec/verify.py's
    ``_residual``: a row whose mass was all on the draft keeps p (rejection had probability 0)."""
    row = p.index_select(0, accepted.view(1))                           # [1, V]
    at = drafts.index_select(0, accepted.view(1)).view(1, 1)
    r = row.scatter(1, at, torch.zeros_like(at, dtype=row.dtype))
    total = r.sum()
    return torch.where((accepted >= m) | (total <= 0), row, r / total)
