"""Speculative-decoding metrics for /metrics, read from the engine's counters at scrape time.

- ``mtpserve:spec_decode_num_draft_tokens_total``: draft tokens verified by the target,
- ``mtpserve:spec_decode_num_accepted_tokens_total``: of those, accepted,
- ``mtpserve:spec_decode_num_verify_steps_total``: verify steps (steps that carried drafts),
- ``mtpserve:spec_decode_num_benched_requests_total``: requests that sat out speculation, started
  while the acceptance pooled over earlier requests paid for no draft (spec/shared_acceptance.py),
- ``mtpserve:spec_decode_num_scout_requests_total``: requests that started so but from the
  configured prior instead (scouts: they may draft),
- ``mtpserve:spec_decode_accepted_tokens_per_step``: histogram of accepted drafts per verify step
  (buckets 0..k); acceptance length = 1 + sum / count.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

PREFIX = "mtpserve:spec_decode_"


class SpecDecodeCollector:
    """A prometheus-client collector over ``stats()["spec"]`` (a ``SpecMetrics``); yields nothing
    while the engine is not built or runs without speculation."""

    def __init__(self, stats: Callable[[], dict]):
        self._stats = stats

    def collect(self):
        try:
            spec = self._stats().get("spec")
        except Exception:  # noqa: BLE001 - a scrape must not fail on a half-built engine
            return
        if spec is None or len(spec.accepted_per_step) < 2:
            return
        for name, value, doc in (
                ("num_draft_tokens", spec.num_draft_tokens, "Draft tokens verified."),
                ("num_accepted_tokens", spec.num_accepted_tokens, "Draft tokens accepted."),
                ("num_verify_steps", spec.num_verify_steps, "Steps that verified drafts."),
                ("num_benched_requests", spec.num_benched_requests,
                 "Requests that sat out speculation (pooled acceptance paid for no draft)."),
                ("num_scout_requests", spec.num_scout_requests,
                 "Requests that started from the prior although the pooled acceptance paid "
                 "for no draft (scouts).")):
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        cumulative, buckets = 0, []
        for j, count in enumerate(list(spec.accepted_per_step)):
            cumulative += count
            buckets.append((str(float(j)), cumulative))
        buckets.append(("+Inf", cumulative))
        yield HistogramMetricFamily(PREFIX + "accepted_tokens_per_step",
                                    "Draft tokens accepted per verify step.", buckets=buckets,
                                    sum_value=spec.num_accepted_tokens)
