"""Prometheus metrics of one app (its own ``CollectorRegistry``), named like vLLM's with ``mtpserve:``.

Counted per engine request (a request with ``n`` choices is ``n`` engine requests):

- ``mtpserve:request_success_total{finish_reason}``: finished engine requests
  (``stop`` | ``length`` | ``abort`` | ``error``),
- ``mtpserve:prompt_tokens_total`` / ``mtpserve:generation_tokens_total``: prompt tokens of
  finished requests, tokens returned to clients,
- ``mtpserve:time_to_first_token_seconds``: from the HTTP request's arrival to a choice's first
  token; ``mtpserve:inter_token_latency_seconds``: between consecutive outputs of one choice (one
  speculative step may return several tokens at once),
- gauges read from the engine at scrape time: ``mtpserve:num_requests_running``,
  ``mtpserve:num_requests_waiting``, ``mtpserve:kv_cache_usage_perc`` (0..1),
- speculative decoding (see ``spec_metrics.py``): ``mtpserve:spec_decode_*`` counters and the
  histogram of accepted drafts per verify step.
"""

from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest

from mtpserve.outputs import RequestOutput
from mtpserve.server.spec_metrics import SpecDecodeCollector

PREFIX = "mtpserve:"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
               0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


class ServerMetrics:
    """The app's metrics. ``stats`` returns the engine gauges (``AsyncEngine.stats``)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, stats: Callable[[], dict[str, float]]):
        self.registry = CollectorRegistry()
        self._stats = stats
        r = self.registry
        self.requests = Counter(PREFIX + "request_success", "Finished engine requests.",
                                ["finish_reason"], registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of finished requests.",
                                     registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens",
                                         "Tokens returned to clients.", registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds",
                              "Seconds from request arrival to a choice's first token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds",
                             "Seconds between consecutive outputs of one choice.",
                             buckets=ITL_BUCKETS, registry=r)
        for name, key, doc in (("num_requests_running", "num_running", "Requests in the running batch."),
                               ("num_requests_waiting", "num_waiting", "Requests waiting to run."),
                               ("kv_cache_usage_perc", "kv_cache_usage", "KV-cache use, 0..1.")):
            Gauge(PREFIX + name, doc, registry=r).set_function(self._gauge(key))
        r.register(SpecDecodeCollector(stats))

    def _gauge(self, key: str) -> Callable[[], float]:
        def read() -> float:
            try:
                return float(self._stats().get(key, 0.0))
            except Exception:  # noqa: BLE001 - a scrape must not fail on a half-built engine
                return 0.0
        return read

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def track(self, arrival: float) -> "RequestTracker":
        """A tracker for one engine request that arrived at ``arrival`` (``time.perf_counter``)."""
        return RequestTracker(self, arrival)


class RequestTracker:
    """Feeds one engine request's outputs into the metrics; ``finish`` is idempotent."""

    def __init__(self, metrics: ServerMetrics, arrival: float):
        self._m = metrics
        self._arrival = arrival
        self._last: float | None = None
        self._done = False

    def on_output(self, out: RequestOutput) -> None:
        if out.new_token_ids:
            now = time.perf_counter()
            if self._last is None:
                self._m.ttft.observe(now - self._arrival)
            else:
                self._m.itl.observe(now - self._last)
            self._last = now
            self._m.generation_tokens.inc(len(out.new_token_ids))
        if out.finished:
            reason = "error" if out.error is not None else (out.finish_reason or "abort")
            self.finish(reason, out.num_prompt_tokens)

    def finish(self, finish_reason: str, num_prompt_tokens: int = 0) -> None:
        """Count the request as finished (first call only)."""
        if self._done:
            return
        self._done = True
        self._m.requests.labels(finish_reason=finish_reason).inc()
        self._m.prompt_tokens.inc(num_prompt_tokens)
