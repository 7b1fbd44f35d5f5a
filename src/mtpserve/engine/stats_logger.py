"""One log line per interval: throughput, queue, KV use and speculative acceptance."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("mtpserve.stats")


class StatsLogger:
    """Call :meth:`step` after every engine step with the tokens it generated; every
    ``interval`` seconds (of activity) it logs what happened since the last line."""

    def __init__(self, interval: float = 10.0):
        self.interval = interval
        self._t0 = time.monotonic()
        self._tokens = 0
        self._drafts0 = self._accepted0 = self._steps0 = 0

    def step(self, engine, num_generated: int) -> None:
        self._tokens += num_generated
        now = time.monotonic()
        if now - self._t0 < self.interval:
            return
        s, spec = engine.stats(), engine.spec_metrics
        line = (f"generation {self._tokens / (now - self._t0):.1f} tok/s, running "
                f"{s['num_running']}, waiting {s['num_waiting']}, KV cache "
                f"{100 * s['kv_cache_usage']:.1f}%")
        steps = spec.num_verify_steps - self._steps0
        if steps:
            drafts = spec.num_draft_tokens - self._drafts0
            accepted = spec.num_accepted_tokens - self._accepted0
            line += (f", spec: acceptance rate {accepted / max(drafts, 1):.2f}, acceptance "
                     f"length {(accepted + steps) / steps:.2f}")
        if spec.num_benched_requests:
            line += f", {spec.num_benched_requests} requests benched (drafts did not pay)"
        logger.info(line)
        self._t0, self._tokens = now, 0
        self._drafts0, self._accepted0 = spec.num_draft_tokens, spec.num_accepted_tokens
        self._steps0 = spec.num_verify_steps
