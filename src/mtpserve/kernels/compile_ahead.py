"""Compile the Triton kernels of a forward in parallel, before it first runs.

Triton compiles a kernel when it is first launched with a new specialization (its constexprs,
dtypes, and which integer arguments are 1 or multiples of 16), one compile after another as a
forward reaches them: on the H200, 21 compiles and 6.6 s of a Qwen3-1.7B-shaped engine's start
(``benchmarks/gpu_startup.py``). Inside :func:`compiling_ahead`, a Triton launch compiles
without running (``JITFunction.run`` with ``warmup=True``) under Triton's ``AsyncCompileMode``,
so the compile goes to a thread pool (Triton's passes and ptxas run outside the GIL for much of
their time). A *dry* forward in that context queues every compile the real forward needs; its
PyTorch ops still run, on whatever the skipped kernels left in their outputs (uninitialised
memory), so a Triton kernel whose output feeds an index must make it valid when :func:`dry`
(``moe_router_triton.route`` zeroes its expert ids). Leaving the context waits for the
compiles; the real forwards then find them in Triton's in-memory cache. Where Triton lacks
``AsyncCompileMode`` (before 3.4) the context does nothing and kernels compile as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger(__name__)

_dry = False
# on: the engine starts Triton's one-time set-up in a thread before it loads the tokenizer and
# the weights (warm_up_in_background). A fresh 1.7B build (empty Triton cache) took 10.89 and
# 11.93 s with it, 12.00 and 12.50 s without (benchmarks/gpu_build_ab.py, two repeats in turns,
# BENCHMARKS.md session 19): a thin measurement, -0.8 s median
WARM_UP_AHEAD = True
_warming: threading.Thread | None = None


def dry() -> bool:
    """True inside :func:`compiling_ahead`: Triton launches only compile."""
    return _dry


def warm_up_in_background(device) -> None:
    """On a CUDA ``device`` with WARM_UP_AHEAD on: compile and launch a one-element Triton
    kernel in a daemon thread, so that Triton's one-time set-up (its driver utilities and the
    kernel launcher built with the C compiler, the CUDA backend, ptxas found and asked its
    version) runs while the engine loads the tokenizer and the weights, much of it in
    subprocesses outside the GIL. :func:`compiling_ahead` waits for the thread first. A failure
    there is logged and left to the real compiles to meet again."""
    global _warming
    if not WARM_UP_AHEAD or getattr(device, "type", device) != "cuda" or _warming is not None:
        return

    def run():
        try:
            import torch

            from mtpserve.kernels.fused_triton import silu_and_mul
            # Triton launches on the thread's current device: the engine's, if it names one
            index = getattr(device, "index", None)
            with torch.cuda.device(index) if index is not None else contextlib.nullcontext():
                silu_and_mul(torch.zeros(1, 2, device=device, dtype=torch.bfloat16))
        except Exception:  # noqa: BLE001  the engine's own compiles report real faults
            logger.exception("Triton warm-up failed")

    _warming = threading.Thread(target=run, name="triton-warm-up", daemon=True)
    _warming.start()


def _wait_for_warm_up() -> None:
    if _warming is not None:
        _warming.join()


@contextlib.contextmanager
def compiling_ahead(threads: int | None = None):
    """Run the body with Triton launches turned into parallel compiles (see the module doc).

    Yields True when compiles go ahead, False when this Triton cannot (the body then should not
    run a dry forward). Not reentrant; single-threaded use (engine start-up)."""
    global _dry
    try:
        from triton.runtime._async_compile import AsyncCompileMode
        from triton.runtime.jit import JITFunction
    except ImportError:
        yield False
        return
    if _dry:
        raise RuntimeError("compiling_ahead is not reentrant")
    _wait_for_warm_up()   # it launches a kernel: not while JITFunction.run is replaced
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    t0 = time.perf_counter()
    workers = threads or min(16, os.cpu_count() or 1)
    with (ThreadPoolExecutor(workers, thread_name_prefix="triton-compile") as pool,
          AsyncCompileMode(pool) as mode):   # on leaving: waits for every compile it queued
        JITFunction.run, _dry = compile_only, True
        try:
            yield True
        finally:
            JITFunction.run, _dry = run, False
            queued = len(mode.future_kernels)
    if queued:
        logger.info("compiled %d Triton kernels on %d threads in %.1f s", queued, workers,
                    time.perf_counter() - t0)


def token_buckets(max_tokens: int) -> list[int]:
    """Token counts whose forwards meet the Triton specializations of every count from 1 to
    ``max_tokens``: the kernels' constexprs follow powers of two of the count (tiles, rows per
    program) and Triton specializes integer arguments that are 1 or multiples of 16, so per
    power of two p: p (a multiple of 16 from 16 on) and p + 1 (not one), p + 2 (even, not a
    multiple of 16). Sorted, each at most ``max_tokens``."""
    sizes, p = set(), 1
    while p <= max_tokens:
        sizes.update(n for n in (p, p + 1, p + 2) if n <= max_tokens)
        p *= 2
    return sorted(sizes)
