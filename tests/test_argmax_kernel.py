"""kernels/argmax_triton.py on the CPU: the kernel under Triton's interpreter (in a subprocess,
since TRITON_INTERPRET must be set before a kernel is defined) against ``torch.argmax``, and its
argument checks. The same cases on CUDA: tests/test_gpu.py."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from interpreted import run_interpreted  # noqa: E402

from mtpserve.kernels.argmax_triton import row_argmax  # noqa: E402

_INTERPRETED = """
import json
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import argmax_triton
import argmax_check
assert isinstance(argmax_triton._argmax_kernel, InterpretedFunction)
print("RESULT " + json.dumps(argmax_check.check("cpu")))
"""


def test_kernel_under_triton_interpreter_matches_torch_argmax():
    """argmax_check.check("cpu"): every row of every case (1-151936 values, ties across and
    within chunks, the max in the last value, rows of -inf, row slices of a wider tensor) as
    torch.argmax, mapped through a strided and an int32 id map (int64 ids either way),
    written into ``out``; a NaN beats every number, +inf included."""
    bad = json.loads(run_interpreted(_INTERPRETED, timeout=300))
    assert len(bad) == 19 and all(v == 0 for v in bad.values()), bad


def test_cpu_path_and_errors():
    x = torch.tensor([[1.0, 3.0, 3.0], [-1.0, -2.0, -1.0]])
    assert row_argmax(x).tolist() == [1, 0]
    assert row_argmax(x, torch.tensor([10, 11, 12])).tolist() == [11, 10]
    with pytest.raises(ValueError, match="float rows"):
        row_argmax(x.double())
    with pytest.raises(ValueError, match="float rows"):
        row_argmax(x.t())
    with pytest.raises(ValueError, match="contiguous \\[2\\] int64"):
        row_argmax(x, out=torch.zeros(2, 2, dtype=torch.int64)[:, 0])
    with pytest.raises(ValueError, match="contiguous \\[2\\] int64"):
        row_argmax(x, out=torch.zeros(2, dtype=torch.int32))


_DRY = """
import json, torch
from mtpserve.kernels import compile_ahead
from mtpserve.kernels.argmax_triton import row_argmax
x = torch.zeros(2, 3000)
x[0, 2999] = x[1, 1234] = 1.0
wet = row_argmax(x).tolist()
compile_ahead._dry = True          # as inside compiling_ahead(): a valid index, not the result
print("RESULT " + json.dumps([wet, row_argmax(x).tolist()]))
"""


def test_a_dry_forward_gets_zeros():
    """Inside kernels/compile_ahead.py's dry forwards Triton launches only compile; the result
    must still index safely (the next draft step embeds it): zeros."""
    wet, dry = json.loads(run_interpreted(_DRY, timeout=120))
    assert wet == [2999, 1234] and dry == [0, 0]
