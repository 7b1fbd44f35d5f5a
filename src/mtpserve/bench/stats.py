"""Summary of one concurrency level from its request records.

Definitions (DESIGN.md's terms):

- TTFT: send to the first chunk carrying a token.
- ITL: the gap between consecutive token-carrying chunks of a request (pooled over requests); a
  speculative chunk may carry several tokens, so ITL grows with acceptance while TPOT shrinks.
- TPOT: per request, (last token chunk - first token chunk) / (output tokens - 1).
- per-request tok/s: output tokens / (end of stream - send); total tok/s: all output tokens of
  the level / the level's wall time.
- acceptance length: (accepted drafts + verify steps) / verify steps, summed over the requests'
  ``mtpserve.spec`` stats (mean tokens emitted per verify step, bonus included).
"""

from __future__ import annotations

import math
from typing import Sequence

from mtpserve.bench.client import RequestRecord

SPEC_KEYS = ("num_draft_tokens", "num_accepted_tokens", "num_verify_steps")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics
    (Hyndman & Fan type 7, numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def acceptance_length(accepted: int, steps: int) -> float | None:
    """Mean tokens per verify step, bonus included; None without verify steps."""
    return (accepted + steps) / steps if steps > 0 else None


def tpot(r: RequestRecord) -> float | None:
    """Seconds per output token after the first; None for fewer than two streamed tokens."""
    n = r.streamed_tokens
    if n < 2:
        return None
    return (r.chunk_times[-1] - r.chunk_times[0]) / (n - 1)


def itl_gaps(r: RequestRecord) -> list[float]:
    """Seconds between consecutive token-carrying chunks of ``r``."""
    return [b - a for a, b in zip(r.chunk_times, r.chunk_times[1:])]


def spec_totals(records: Sequence[RequestRecord]) -> dict | None:
    """Summed ``mtpserve.spec`` counts with their acceptance length; None when no request had
    them (a server without speculation)."""
    specs = [r.spec for r in records if r.ok and r.spec]
    if not specs:
        return None
    out = {k: sum(int(s.get(k, 0)) for s in specs) for k in SPEC_KEYS}
    out["acceptance_length"] = acceptance_length(out["num_accepted_tokens"],
                                                 out["num_verify_steps"])
    return out


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3


def _dist_ms(values: list[float]) -> dict:
    return {"mean": _ms(sum(values) / len(values)) if values else None,
            "p50": _ms(percentile(values, 50)), "p99": _ms(percentile(values, 99))}


def summarize(records: Sequence[RequestRecord], wall_s: float, concurrency: int) -> dict:
    """The level summary (times in ms, rates per second; failed requests only counted).

    Keys: concurrency, num_requests, num_errors, wall_s, output_tokens, prompt_tokens,
    request_rate, per_request_tok_s {mean, p50}, total_tok_s, ttft_ms / itl_ms / tpot_ms
    {mean, p50, p99}, spec (see ``spec_totals``), acceptance_length.
    """
    ok = [r for r in records if r.ok]
    rates = [r.output_tokens / r.latency for r in ok if r.latency]
    out_tokens = sum(r.output_tokens for r in ok)
    spec = spec_totals(ok)
    return {
        "concurrency": concurrency, "num_requests": len(records),
        "num_errors": len(records) - len(ok), "wall_s": wall_s,
        "output_tokens": out_tokens,
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in ok),
        "request_rate": len(ok) / wall_s if wall_s > 0 else None,
        "per_request_tok_s": {"mean": sum(rates) / len(rates) if rates else None,
                              "p50": percentile(rates, 50)},
        "total_tok_s": out_tokens / wall_s if wall_s > 0 else None,
        "ttft_ms": _dist_ms([r.ttft for r in ok if r.ttft is not None]),
        "itl_ms": _dist_ms([g for r in ok for g in itl_gaps(r)]),
        "tpot_ms": _dist_ms([t for r in ok if (t := tpot(r)) is not None]),
        "spec": spec,
        "acceptance_length": spec["acceptance_length"] if spec else None,
    }
