"""``triton.jit`` options that keep a kernel to one compile as step sizes change.

Triton compiles a kernel anew for each *specialization* of its arguments: an integer that is 1
or a multiple of 16, and a pointer whose address is a multiple of 16 bytes. ``triton.jit``'s
``do_not_specialize`` and (from 3.3) ``do_not_specialize_on_alignment`` turn these off; which of
them covers what has moved between Triton versions (3.9's first covers both), so both are given.
An argument that flips between these from step to step (a token count, a block table's width, a
view that starts at a varying offset) makes a fresh engine compile at use, 0.3-0.7 s a kernel on
the H200 (benchmarks/gpu_mtp_load.py, BENCHMARKS.md), however much was compiled ahead.
"""

from __future__ import annotations

import inspect

import triton


def unspecialized(ints: tuple[str, ...] = (), pointers: tuple[str, ...] = ()) -> dict:
    """Keyword arguments for ``triton.jit`` that specialize on none of ``ints`` (integer
    arguments: neither 1 nor divisibility by 16) and not on the alignment of ``pointers``.
    A Triton without ``do_not_specialize_on_alignment`` gets ``do_not_specialize`` alone."""
    params = inspect.signature(triton.jit).parameters
    if "do_not_specialize_on_alignment" not in params:
        return {"do_not_specialize": [*ints, *pointers]}
    return {"do_not_specialize": list(ints),
            "do_not_specialize_on_alignment": [*ints, *pointers]}
