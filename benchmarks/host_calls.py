"""Where an engine step's host time goes in small torch calls: by op and by the line of
mtpserve that made it.

A speculative step on the GPU issues dozens of tiny ops (uploads, copies into graph inputs,
fills, index picks), each a few microseconds of host time; cProfile inflates them and
torch.profiler's CPU table does not say who called. :func:`torch_calls` wraps the Python
entry points of those ops while its body runs and sums, per (op, calling line in
``mtpserve``), the calls and the wall seconds spent inside them (unprofiled otherwise).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch

import mtpserve

# Tensor methods and torch functions a step's host path calls (what is not called costs nothing)
TENSOR_METHODS = ("copy_", "to", "fill_", "zero_", "index_copy_", "index_fill_", "index_select",
                  "gather", "clone", "tolist", "view", "expand", "long", "sum", "argmax",
                  "cumprod", "__getitem__", "__setitem__", "masked_fill_", "scatter_")
TORCH_FUNCTIONS = ("tensor", "empty", "zeros", "ones", "full", "arange", "cat", "stack",
                   "where")


_PACKAGE = os.path.dirname(os.path.abspath(mtpserve.__file__)) + os.sep


def _site(depth: int = 2) -> str:
    """``file.py:line function`` (relative to the package) of the nearest caller inside the
    mtpserve package's own sources (not tests, benchmarks or a venv that happen to sit in a
    folder named mtpserve)."""
    f = sys._getframe(depth)
    while f is not None and not f.f_code.co_filename.startswith(_PACKAGE):
        f = f.f_back
    if f is None:
        return "?"
    return f"{f.f_code.co_filename[len(_PACKAGE):]}:{f.f_lineno} {f.f_code.co_name}"


def _wrap(fn, label: str, totals: dict):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t
            row = totals.setdefault((label, _site()), [0, 0.0])
            row[0] += 1
            row[1] += dt
    return wrapper


@contextlib.contextmanager
def torch_calls():
    """Count the host's torch calls (``TENSOR_METHODS``, ``TORCH_FUNCTIONS``) while the body
    runs: yields {(op, mtpserve call site): [calls, seconds]}, filled as it runs. Calls made
    inside another counted call (e.g. ``to`` inside ``tolist``) are not told apart."""
    totals: dict = {}
    saved = []
    for name in TENSOR_METHODS:
        saved.append((torch.Tensor, name, torch.Tensor.__dict__.get(name)))
        setattr(torch.Tensor, name, _wrap(getattr(torch.Tensor, name), f"Tensor.{name}", totals))
    for name in TORCH_FUNCTIONS:
        saved.append((torch, name, getattr(torch, name)))
        setattr(torch, name, _wrap(getattr(torch, name), f"torch.{name}", totals))
    try:
        yield totals
    finally:
        for obj, name, old in saved:
            if old is None:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


def calls_table(totals: dict, steps: int, rows: int = 60) -> str:
    """``totals`` of :func:`torch_calls` per step, most host time first: microseconds, calls,
    op, call site; a first line with the sums."""
    us = sum(s for _, s in totals.values()) / steps * 1e6
    n = sum(c for c, _ in totals.values()) / steps
    out = [f"torch calls on the host: {n:.1f} per step, {us:.1f} us per step (inside them)",
           f"{'us/step':>9} {'n/step':>7}  op  <- mtpserve call site"]
    for (op, site), (c, s) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:rows]:
        out.append(f"{s / steps * 1e6:9.1f} {c / steps:7.1f}  {op}  <- {site}")
    return "\n".join(out) + "\n"
