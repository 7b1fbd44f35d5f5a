"""Optional cProfile of the engine loop, thread or process alike (``MTPSERVE_ENGINE_PROFILE``).

Set ``MTPSERVE_ENGINE_PROFILE=PATH`` and the engine loop (``AsyncEngine``'s thread, or the engine
process of ``--engine-process``) runs under ``cProfile`` for the calling thread only; when the loop
ends (the server stops) the statistics go to ``PATH.<pid>.prof`` (``pstats`` format) and the 40
costliest functions by cumulative time, with the number of engine steps, to ``PATH.<pid>.txt``.
Made to compare where the two loops spend their time per step (BENCHMARKS.md, session 15: the
engine process stepped ~9% slower at 16 streams); off, it costs nothing.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import logging
import os
import pstats

logger = logging.getLogger(__name__)

ENV = "MTPSERVE_ENGINE_PROFILE"


class StepCount:
    """Engine steps run inside :func:`profiled_loop` (the loop adds to ``n``)."""

    n = 0


@contextlib.contextmanager
def profiled_loop():
    """Yield a :class:`StepCount`; profile the body when ``MTPSERVE_ENGINE_PROFILE`` is set (see
    the module doc)."""
    count = StepCount()
    path = os.environ.get(ENV)
    if not path:
        yield count
        return
    prof = cProfile.Profile()
    prof.enable()
    try:
        yield count
    finally:
        prof.disable()
        _write(prof, f"{path}.{os.getpid()}", count.n)


def _write(prof: cProfile.Profile, base: str, steps: int) -> None:
    prof.dump_stats(base + ".prof")
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
    with open(base + ".txt", "w") as f:
        f.write(f"engine steps: {steps}\n{text.getvalue()}")
    logger.info("engine loop profile (%d steps) written to %s.txt", steps, base)
