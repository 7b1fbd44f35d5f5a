"""The server's speculative counters from ``GET /metrics``, to measure a level's acceptance
length from their deltas (independent of the per-response ``mtpserve.spec`` field)."""

from __future__ import annotations

import httpx

from mtpserve.bench.stats import SPEC_KEYS, acceptance_length

PREFIX = "mtpserve:spec_decode_"


def parse_spec_counters(text: str) -> dict[str, float] | None:
    """``{num_draft_tokens, num_accepted_tokens, num_verify_steps}`` from Prometheus text
    (``mtpserve:spec_decode_<key>_total`` lines); None when the server exports none of them."""
    found = {}
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        name, _, value = line.partition(" ")
        key = name[len(PREFIX):].removesuffix("_total")
        if key in SPEC_KEYS and name.endswith("_total"):
            found[key] = float(value.split()[0])
    return found or None


async def scrape_spec_counters(client: httpx.AsyncClient) -> dict[str, float] | None:
    """The counters now; None when /metrics is missing or has no speculative counters."""
    try:
        r = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    return parse_spec_counters(r.text) if r.status_code == 200 else None


def counters_delta(before: dict | None, after: dict | None) -> dict | None:
    """``after - before`` per key with the acceptance length of the delta; None unless both."""
    if before is None or after is None:
        return None
    delta = {k: int(after.get(k, 0) - before.get(k, 0)) for k in SPEC_KEYS}
    delta["acceptance_length"] = acceptance_length(delta["num_accepted_tokens"],
                                                   delta["num_verify_steps"])
    return delta
