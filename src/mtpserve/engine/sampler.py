"""The sampler: processed logits -> the sampling distribution p -> one token per row.

A *row* is one position to sample for one request. Speculative verification asks for several rows
of the same request (each with its own history), so nothing here assumes one row per request.

Pipeline for raw logits ``[N, V]``:

1. :meth:`Sampler.process_logits` — logit bias, min_tokens ban, repetition / presence / frequency
   penalties (see :mod:`mtpserve.engine.penalties`);
2. :meth:`Sampler.probs` — temperature, then top-k, top-p, min-p (each on what the previous one
   left, as in HF ``generate``), softmax; greedy rows get a one-hot at the argmax;
3. :meth:`Sampler.draw` — one draw per row by the exponential race ``argmax(p / E)``,
   ``E ~ Exp(1)`` i.i.d., which picks token ``i`` with probability ``p_i`` (the Gumbel-max trick
   written with exponentials).

``sample`` is exactly ``draw(probs(process_logits(x)))``, so ``probs`` is the distribution that
speculative sampling must use for the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mtpserve.engine.forward_batch import to_device
from mtpserve.engine.penalties import apply_logit_bias, apply_min_tokens, apply_penalties
from mtpserve.outputs import TokenLogprob
from mtpserve.sampling_params import SamplingParams

# top_p above 1 keeps every token even when a float32 cumulative sum creeps past 1.
_TOP_P_OFF = 2.0


@dataclass
class SamplingRow:
    """One position to sample.

    ``generator``: the request's own generator (seeded from ``params.seed``, on the logits'
    device), or None to use the sampler's shared generator. ``output_token_ids``: tokens generated
    before this row's position (penalties, min_tokens). ``eos_token_ids``: the model's EOS ids.
    """

    params: SamplingParams
    generator: torch.Generator | None = None
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    eos_token_ids: Sequence[int] = ()


@dataclass
class SamplerOutput:
    """``token_ids``: ``[N]`` int64 on the logits' device. ``logprobs``: one entry per row
    (None for rows with ``params.logprobs is None``), or None when no row asked for logprobs."""

    token_ids: Tensor
    logprobs: list[TokenLogprob | None] | None = None


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """A generator on ``device`` seeded with ``seed``; None when ``seed`` is None."""
    if seed is None:
        return None
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(seed)
    return gen


class Sampler:
    """Batched sampling over a vocabulary of ``vocab_size`` tokens (CPU or CUDA tensors).

    Rows without their own generator share one generator per device, seeded with ``seed``.
    Every method raises ``ValueError`` when the tensor is not ``[len(rows), vocab_size]``.
    """

    def __init__(self, vocab_size: int, seed: int = 0):
        self.vocab_size = vocab_size
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def default_generator(self, device: torch.device) -> torch.Generator:
        """The shared generator for ``device`` (created and seeded on first use)."""
        device = torch.device(device)
        if device not in self._generators:
            self._generators[device] = make_generator(self.seed, device)
        return self._generators[device]

    def process_logits(self, logits: Tensor, rows: Sequence[SamplingRow]) -> Tensor:
        """Raw logits ``[N, V]`` -> a new float32 ``[N, V]`` tensor with logit bias (clamped to
        [-100, 100]), the min_tokens ban (-inf) and the penalties applied, in that order.
        The input is not modified.

        Raises:
            ValueError: bad shape. IndexError: a token id in the rows is outside the vocabulary.
        """
        self._check(logits, rows)
        out = logits.to(torch.float32, copy=True)
        apply_logit_bias(out, rows)
        apply_min_tokens(out, rows)
        apply_penalties(out, rows)
        return out

    def probs(self, logits: Tensor, rows: Sequence[SamplingRow]) -> Tensor:
        """Processed logits ``[N, V]`` -> float32 probabilities ``[N, V]``.

        Sampled rows: softmax of ``logits / temperature`` restricted to the tokens that survive
        top-k (the k largest, ties at the k-th value kept), then top-p (the most likely tokens
        whose mass before them is < top_p, ties at the last kept value kept), then min-p
        (probability >= min_p * the largest). Greedy rows: one-hot at ``argmax(logits)`` (the
        lowest id among ties).
        """
        self._check(logits, rows)
        logits = logits.to(torch.float32)
        dev = logits.device
        temps = [1.0 if r.params.greedy else r.params.temperature for r in rows]
        scaled = logits / _column(temps, torch.float32, dev)
        keep = _truncation_mask(scaled, rows)
        if keep is not None:
            scaled = scaled.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        greedy = [r.params.greedy for r in rows]
        if any(greedy):
            one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=1, keepdim=True), 1.0)
            probs = torch.where(_column(greedy, torch.bool, dev), one_hot, probs)
        return probs

    def draw(self, probs: Tensor, rows: Sequence[SamplingRow]) -> Tensor:
        """One token per row from ``probs`` ``[N, V]`` -> ``[N]`` int64 (exponential race).

        Greedy rows take ``argmax(probs)`` and use no randomness. A row with a generator draws
        ``V`` exponentials from it (rows sharing a generator draw in row order); the other sampled
        rows draw together from the shared generator. So a seeded row's token depends only on
        its generator's state and its probabilities, not on the rest of the batch.
        """
        self._check(probs, rows)
        dev, vocab = probs.device, probs.shape[1]
        noise = torch.ones_like(probs, dtype=torch.float32)
        shared = [i for i, r in enumerate(rows) if not r.params.greedy and r.generator is None]
        if shared:
            gen = self.default_generator(dev)
            draws = torch.empty(len(shared), vocab, device=dev).exponential_(generator=gen)
            noise.index_copy_(0, to_device(shared, torch.int64, dev), draws)
        for i, r in enumerate(rows):
            if not r.params.greedy and r.generator is not None:
                noise[i] = torch.empty(vocab, device=dev).exponential_(generator=r.generator)
        # An exponential of exactly 0 would turn p=0 into nan (and argmax picks nan).
        noise.clamp_min_(torch.finfo(torch.float32).tiny)
        return (probs.to(torch.float32) / noise).argmax(dim=1)

    def sample(self, logits: Tensor, rows: Sequence[SamplingRow]) -> SamplerOutput:
        """Raw logits ``[N, V]`` -> :class:`SamplerOutput` (token ids ``[N]`` int64, plus
        logprobs of the raw logits for rows that ask). Same errors as :meth:`process_logits`."""
        if all(is_plain_greedy(r) for r in rows):  # nothing to process: one argmax kernel
            self._check(logits, rows)
            token_ids = logits.argmax(dim=1)
        else:
            token_ids = self.draw(self.probs(self.process_logits(logits, rows), rows), rows)
        logprobs = None
        if any(r.params.logprobs is not None for r in rows):
            logprobs = self.logprobs(logits, token_ids, rows)
        return SamplerOutput(token_ids, logprobs)

    def logprobs(self, raw_logits: Tensor, token_ids: Tensor,
                 rows: Sequence[SamplingRow]) -> list[TokenLogprob | None]:
        """``log_softmax`` of the raw logits ``[N, V]`` at ``token_ids`` ``[N]``, plus the
        ``params.logprobs`` best ``(id, logprob)`` pairs, best first (lower id first among equal
        values); None for rows with ``params.logprobs is None``. Reads the results to the host."""
        self._check(raw_logits, rows)
        result: list[TokenLogprob | None] = [None] * len(rows)
        want = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        if not want:
            return result
        sel = torch.tensor(want, device=raw_logits.device)
        lp = torch.log_softmax(raw_logits.index_select(0, sel).to(torch.float32), dim=1)
        toks = token_ids.to(raw_logits.device).index_select(0, sel)
        chosen = lp.gather(1, toks.unsqueeze(1)).squeeze(1).tolist()
        kmax = min(max(rows[i].params.logprobs for i in want), lp.shape[1])
        top_vals, top_ids = lp.topk(kmax, dim=1) if kmax else (lp[:, :0], lp[:, :0].long())
        top_vals, top_ids, toks = top_vals.tolist(), top_ids.tolist(), toks.tolist()
        for j, i in enumerate(want):
            pairs = sorted(zip(top_ids[j], top_vals[j]), key=lambda p: (-p[1], p[0]))
            result[i] = TokenLogprob(toks[j], chosen[j], pairs[: rows[i].params.logprobs])
        return result

    def _check(self, x: Tensor, rows: Sequence[SamplingRow]) -> None:
        if x.dim() != 2 or x.shape[0] != len(rows) or x.shape[1] != self.vocab_size:
            raise ValueError(f"expected a [{len(rows)}, {self.vocab_size}] tensor, "
                             f"got {list(x.shape)}")


def is_plain(row: SamplingRow) -> bool:
    """Nothing changes the raw logits (no bias, penalties or min_tokens ban): ``process_logits``
    is a float32 copy, greedy or sampled."""
    p = row.params
    return (not p.logit_bias and not p.needs_penalties
            and (p.min_tokens == 0 or len(row.output_token_ids) >= p.min_tokens))


def is_plain_greedy(row: SamplingRow) -> bool:
    """Greedy with nothing that changes the logits (:func:`is_plain`)."""
    return row.params.greedy and is_plain(row)


def _truncation_mask(scaled: Tensor, rows: Sequence[SamplingRow]) -> Tensor | None:
    """``[N, V]`` bool: tokens that survive top-k, top-p and min-p; None when no row truncates.
    Greedy rows are never truncated (their one-hot ignores it)."""
    n, vocab = scaled.shape
    dev = scaled.device
    sampled = [(r.params if not r.params.greedy else SamplingParams()) for r in rows]
    ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in sampled]
    ps = [p.top_p if p.top_p < 1.0 else _TOP_P_OFF for p in sampled]
    mps = [p.min_p for p in sampled]
    need_k, need_p, need_m = min(ks) < vocab, min(ps) < 1.0, max(mps) > 0.0
    if not (need_k or need_p or need_m):
        return None
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if need_k or need_p:
        ordered = scaled.sort(dim=1, descending=True).values
        if need_k:
            kth = ordered.gather(1, to_device(ks, torch.int64, dev).unsqueeze(1) - 1)
            keep &= scaled >= kth
            ordered = ordered.masked_fill(ordered < kth, float("-inf"))
        if need_p:
            mass = torch.softmax(ordered, dim=1).cumsum(dim=1)
            before = torch.cat([torch.zeros(n, 1, device=dev), mass[:, :-1]], dim=1)
            n_keep = (before < _column(ps, torch.float32, dev)).sum(dim=1, keepdim=True)
            keep &= scaled >= ordered.gather(1, n_keep.clamp_min(1) - 1)
    if need_m:
        p = torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=1)
        keep &= p >= _column(mps, torch.float32, dev) * p.max(dim=1, keepdim=True).values
    return keep


def _column(values: list, dtype: torch.dtype, device: torch.device) -> Tensor:
    """[len(values), 1] on ``device``, uploaded without blocking the host (speculative
    sampling on the device runs while the verify forward is still queued: spec/draft_ahead.py)."""
    return to_device(values, dtype, device).unsqueeze(1)
