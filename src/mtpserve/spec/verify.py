"""Verification of draft tokens: greedy matching and lossless speculative sampling.

Speculative sampling (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", Algorithm 1; Chen et al. 2023): for draft token x with draft probability q(x) and
target probability p(x), accept with probability min(1, p(x) / q(x)); on the first rejection emit
a token drawn from normalize(max(0, p - q)) and stop; if all drafts pass, emit a bonus token drawn
from p at the position after the last draft. The emitted tokens are distributed exactly as if
sampled from p one at a time. A deterministic proposer has a one-hot q. Greedy requests take the
target's argmax at each position and accept while the draft equals it.

p is the distribution the non-speculative sampler would use at that position (bias, penalties,
min_tokens, temperature, top-k, top-p, min-p, with the drafts before it counted as output).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mtpserve.engine.forward_batch import to_device
from mtpserve.engine.sampler import Sampler, SamplingRow, is_plain_greedy
from mtpserve.outputs import TokenLogprob


@dataclass
class VerifyInput:
    """One sequence's verification: ``rows`` are its ``1 + len(drafts)`` sampling rows (row i
    predicts the token after ``drafts[:i]``), ``first_row`` their offset in the logits, and
    ``draft_probs`` [len(drafts), V] the proposer's q (None: deterministic, one-hot)."""

    rows: list[SamplingRow]
    first_row: int
    drafts: list[int]
    draft_probs: Tensor | None


@dataclass
class VerifyResult:
    """``token_ids`` to emit (accepted drafts, then one corrected or bonus token), their
    ``logprobs`` (None entries when not asked), and ``num_accepted`` drafts."""

    token_ids: list[int]
    logprobs: list[TokenLogprob | None]
    num_accepted: int


def verify(sampler: Sampler, logits: Tensor, items: list[VerifyInput],
           targets: list[int] | None = None) -> list[VerifyResult]:
    """Verify every sequence's drafts against the target's logits [N, V] (raw, float32).

    Greedy sequences need only the target's argmax per row, read to the host in one transfer;
    the sampling distribution p is built only for sampled sequences. ``targets``: per logits
    row, the token the step emits there if the row is kept, already decided on the device
    (spec/draft_ahead.py: the argmax of plain greedy rows, spec/sampled_ahead.py's speculative
    sampling of plain sampled rows); every sequence then accepts the longest prefix of drafts
    equal to its targets and emits the target after it.
    """
    order = [it.first_row + i for it in items for i in range(len(it.rows))]
    raw = logits if order == list(range(len(order))) else \
        logits.index_select(0, to_device(order, torch.int64, logits.device))
    starts, n = [], 0
    for it in items:
        starts.append(n)
        n += len(it.rows)
    decided = targets is not None
    # matched: accept the drafts equal to each row's choice (the argmax, or a decided target)
    matched = [i for i, it in enumerate(items) if decided or it.rows[0].params.greedy]
    sampled = [i for i, it in enumerate(items) if not (decided or it.rows[0].params.greedy)]
    if decided:
        chosen = [[targets[items[i].first_row + r] for r in range(len(items[i].rows))]
                  for i in matched]
    else:
        chosen = _greedy_targets(sampler, raw, [items[i] for i in matched],
                                 [starts[i] for i in matched])
    p = _target_probs(sampler, raw, [items[i] for i in sampled], [starts[i] for i in sampled])
    results: list[VerifyResult | None] = [None] * len(items)
    for j, i in enumerate(matched):
        tokens, accepted = _verify_greedy(chosen[j], items[i].drafts)
        results[i] = VerifyResult(tokens, _logprobs(sampler, raw, starts[i], tokens, items[i]),
                                  accepted)
    for j, i in enumerate(sampled):
        tokens, accepted = _verify_sampled(sampler, p[j], items[i])
        results[i] = VerifyResult(tokens, _logprobs(sampler, raw, starts[i], tokens, items[i]),
                                  accepted)
    return results


def _rows_of(raw: Tensor, items: list[VerifyInput], starts: list[int]):
    idx = [s + k for it, s in zip(items, starts) for k in range(len(it.rows))]
    rows = [r for it in items for r in it.rows]
    if idx == list(range(idx[0], idx[0] + len(idx))):  # contiguous (e.g. all greedy): a view
        return raw[idx[0]:idx[0] + len(idx)], rows
    return raw.index_select(0, to_device(idx, torch.int64, raw.device)), rows


def _greedy_targets(sampler: Sampler, raw: Tensor, items, starts) -> list[list[int]]:
    """Per greedy sequence, the target's choice (argmax of the processed logits) at each row."""
    if not items:
        return []
    sub, rows = _rows_of(raw, items, starts)
    if not all(is_plain_greedy(r) for r in rows):
        sub = sampler.process_logits(sub, rows)
    flat = sub.argmax(dim=1).tolist()
    out, k = [], 0
    for it in items:
        out.append(flat[k:k + len(it.rows)])
        k += len(it.rows)
    return out


def _target_probs(sampler: Sampler, raw: Tensor, items, starts) -> list[Tensor]:
    """Per sampled sequence, p [rows, V]: the distribution the plain sampler would draw from."""
    if not items:
        return []
    sub, rows = _rows_of(raw, items, starts)
    p = sampler.probs(sampler.process_logits(sub, rows), rows)
    out, k = [], 0
    for it in items:
        out.append(p[k:k + len(it.rows)])
        k += len(it.rows)
    return out


def _verify_greedy(target: list[int], drafts: list[int]) -> tuple[list[int], int]:
    j = 0
    while j < len(drafts) and drafts[j] == target[j]:
        j += 1
    return target[: j + 1], j


def _verify_sampled(sampler: Sampler, p: Tensor, it: VerifyInput) -> tuple[list[int], int]:
    gen = it.rows[0].generator or sampler.default_generator(p.device)
    draws = torch.rand(len(it.drafts), generator=gen, device=p.device).tolist()
    for i, x in enumerate(it.drafts):
        q = it.draft_probs[i] if it.draft_probs is not None else None
        qx = 1.0 if q is None else float(q[x])
        px = float(p[i, x])
        if qx > 0 and draws[i] < min(1.0, px / qx):
            continue
        residual = _residual(p[i], q, x)
        t = int(sampler.draw(residual.unsqueeze(0), [it.rows[i]])[0])
        return it.drafts[:i] + [t], i
    bonus = int(sampler.draw(p[len(it.drafts)].unsqueeze(0), [it.rows[-1]])[0])
    return it.drafts + [bonus], len(it.drafts)


def _residual(p: Tensor, q: Tensor | None, x: int) -> Tensor:
    """normalize(max(0, p - q)); for a one-hot q at x that is p without x."""
    if q is None:
        r = p.clone()
        r[x] = 0.0
    else:
        r = (p - q).clamp_min(0.0)
    total = r.sum()
    return r / total if total > 0 else p  # p == q exactly: rejection has probability 0 anyway


def _logprobs(sampler: Sampler, raw: Tensor, start: int, tokens: list[int], it: VerifyInput):
    used = it.rows[: len(tokens)]
    if all(r.params.logprobs is None for r in used):
        return [None] * len(tokens)
    ids = torch.tensor(tokens, device=raw.device)
    return sampler.logprobs(raw[start:start + len(tokens)], ids, used)
