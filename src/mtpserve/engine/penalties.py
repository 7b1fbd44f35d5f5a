"""Logit processing before sampling: logit bias, the min_tokens ban and repetition penalties.

Every function takes float32 logits ``[N, V]`` (one row per sampled position) and the matching
``rows`` (objects with ``params``, ``prompt_token_ids``, ``output_token_ids`` and
``eos_token_ids``, see :class:`mtpserve.engine.sampler.SamplingRow`) and edits the logits in place.
Per-row data is gathered on the host once and sent to the logits' device in one copy per tensor;
nothing is read back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

# OpenAI clamps each logit_bias value to this range.
LOGIT_BIAS_LIMIT = 100.0


def apply_logit_bias(logits: Tensor, rows: Sequence) -> None:
    """Add ``params.logit_bias[token]``, clamped to [-100, 100], to each row in place.

    Args:
        logits: ``[N, V]`` float32, edited in place.
        rows: ``N`` rows; a row whose ``params.logit_bias`` is empty or None is left alone.

    Raises:
        IndexError: a biased token id is outside ``[0, V)``.
    """
    r_idx, t_idx, vals = [], [], []
    for i, row in enumerate(rows):
        for tok, bias in (row.params.logit_bias or {}).items():
            r_idx.append(i)
            t_idx.append(int(tok))
            vals.append(min(max(float(bias), -LOGIT_BIAS_LIMIT), LOGIT_BIAS_LIMIT))
    if not r_idx:
        return
    _check_ids(t_idx, logits.shape[1], "logit_bias")
    dev = logits.device
    index = (torch.tensor(r_idx, device=dev), torch.tensor(t_idx, device=dev))
    logits.index_put_(index, torch.tensor(vals, dtype=logits.dtype, device=dev), accumulate=True)


def min_tokens_banned_ids(row) -> list[int]:
    """Token ids a row may not produce yet: ``stop_token_ids`` and EOS (EOS only without
    ``ignore_eos``, since then EOS does not end generation), while fewer than ``min_tokens``
    tokens were generated before the row's position. Empty once the minimum is reached."""
    p = row.params
    if len(row.output_token_ids) >= p.min_tokens:
        return []
    banned = list(p.stop_token_ids)
    if not p.ignore_eos:
        banned += list(row.eos_token_ids)
    return banned


def apply_min_tokens(logits: Tensor, rows: Sequence) -> None:
    """Set the logits of :func:`min_tokens_banned_ids` to ``-inf`` in place.

    Raises:
        IndexError: a banned token id is outside ``[0, V)``.
    """
    r_idx, t_idx = [], []
    for i, row in enumerate(rows):
        banned = min_tokens_banned_ids(row)
        r_idx += [i] * len(banned)
        t_idx += banned
    if not r_idx:
        return
    _check_ids(t_idx, logits.shape[1], "min_tokens ban")
    dev = logits.device
    index = (torch.tensor(r_idx, device=dev), torch.tensor(t_idx, device=dev))
    logits.index_put_(index, torch.tensor(float("-inf"), dtype=logits.dtype, device=dev))


def apply_penalties(logits: Tensor, rows: Sequence) -> None:
    """Repetition, presence and frequency penalties, in place, for rows that ask for them.

    - repetition (HF ``RepetitionPenaltyLogitsProcessor``, after CTRL, Keskar et al. 2019): for
      every token seen in the prompt or the output, a positive logit is divided by the penalty and a
      negative one multiplied by it;
    - presence / frequency (OpenAI API reference): ``logit -= presence * (count > 0) +
      frequency * count`` with ``count`` the token's occurrences in the output only.

    Repetition is applied first. Rows without penalties are not touched.

    Raises:
        IndexError: a prompt or output token id is outside ``[0, V)``.
    """
    sel = [i for i, row in enumerate(rows) if row.params.needs_penalties]
    if not sel:
        return
    sub_rows = [rows[i] for i in sel]
    dev, vocab = logits.device, logits.shape[1]
    sel_t = torch.tensor(sel, device=dev)
    sub = logits.index_select(0, sel_t)
    out_counts = _token_counts([r.output_token_ids for r in sub_rows], vocab, dev)
    prompt_seen = _token_counts([r.prompt_token_ids for r in sub_rows], vocab, dev) > 0
    rep = _column([r.params.repetition_penalty for r in sub_rows], dev)
    seen = prompt_seen | (out_counts > 0)
    penalized = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(seen, penalized, sub)
    pres = _column([r.params.presence_penalty for r in sub_rows], dev)
    freq = _column([r.params.frequency_penalty for r in sub_rows], dev)
    sub = sub - pres * (out_counts > 0).to(sub.dtype) - freq * out_counts
    logits.index_copy_(0, sel_t, sub)


def _token_counts(seqs: list[Sequence[int]], vocab: int, device: torch.device) -> Tensor:
    """``[len(seqs), vocab]`` float32: how often each token id occurs in each sequence."""
    width = max((len(s) for s in seqs), default=0)
    flat = [t for s in seqs for t in s]
    _check_ids(flat, vocab, "penalty history")
    # Pad with the extra column ``vocab`` and drop it after counting.
    padded = [list(s) + [vocab] * (width - len(s)) for s in seqs]
    idx = torch.tensor(padded, dtype=torch.int64).reshape(len(seqs), width).to(device)
    counts = torch.zeros(len(seqs), vocab + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, idx, torch.ones(idx.shape, dtype=torch.float32, device=device))
    return counts[:, :vocab]


def _column(values: list[float], device: torch.device) -> Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)


def _check_ids(ids: list[int], vocab: int, what: str) -> None:
    if ids and (min(ids) < 0 or max(ids) >= vocab):
        bad = next(t for t in ids if not 0 <= t < vocab)
        raise IndexError(f"{what}: token id {bad} is outside the vocabulary [0, {vocab})")
