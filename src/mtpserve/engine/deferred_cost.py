"""What taking a synchronous step's held deltas is expected to cost the host (engine.py
``take_deferred_outputs``): the seconds that step is charged when it is recorded for the load
gate and the step timer, before the deltas are taken behind the next launch."""

from __future__ import annotations

import statistics
from collections import deque

from mtpserve.spec.load_gate import LoadGate


class DeferredCost:
    """Seconds per delta taken, by how many are taken at once (the load gate's buckets of powers
    of two, ``LoadGate.bucket``: one delta alone costs several times its share of 64).

    The median of a bucket's last ``window`` samples, not an average: one slow take (a garbage
    collection, the GIL handed to the HTTP server's thread) must not be charged to the steps
    after it. A review of the first version, an exponential average, found one take 50 times a
    step's length pushing the next steps' seconds below zero, which the load gate drops.
    """

    def __init__(self, window: int = 16):
        self.window = window
        self._samples: dict[int, deque] = {}
        self._medians: dict[int, float] = {}

    def observe(self, n: int, seconds: float) -> None:
        """``n`` deltas (n >= 1) were taken in ``seconds``."""
        key = LoadGate.bucket(n)
        samples = self._samples.setdefault(key, deque(maxlen=self.window))
        samples.append(seconds / n)
        self._medians[key] = statistics.median(samples)

    def expect(self, n: int) -> float:
        """Expected seconds to take ``n`` deltas: n x the median per delta of their bucket, or
        of the nearest bucket with samples; 0.0 for none, or before any sample."""
        if n <= 0 or not self._medians:
            return 0.0
        key = LoadGate.bucket(n)
        near = min(self._medians, key=lambda k: (abs(k - key), k))
        return n * self._medians[near]
