"""``n`` completions of one prompt are ``n`` engine requests; this names and seeds them."""

from __future__ import annotations

import dataclasses

from mtpserve.sampling_params import SamplingParams


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Parameters of completion ``index`` of ``params.n``: ``n = 1``, and ``seed + index`` when a
    seed is set (so the ``n`` samples differ but the whole set is reproducible)."""
    seed = None if params.seed is None else params.seed + index
    return dataclasses.replace(params, n=1, seed=seed)


def child_request_id(request_id: str, index: int, n: int) -> str:
    return request_id if n == 1 else f"{request_id}-{index}"
