"""The skinny product's split-K reduction (kernels/gemv_triton.py) on the CPU under Triton's
interpreter (float32, in a subprocess: tests/interpreted.py). The same checks in bfloat16 on
CUDA: tests/test_gpu.py."""

from __future__ import annotations

from interpreted import run_interpreted

_CODE = """
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import gemv_triton
import gemv_check
assert isinstance(gemv_triton._gemv_kernel, InterpretedFunction)
print("RESULT", gemv_check.check_split_k("cpu"))
"""

_DEFERRED = """
import gemv_check
print("RESULT", gemv_check.check_deferred_sum("cpu"))
"""


def test_gemv_split_k_under_triton_interpreter():
    """check_split_k("cpu") of tests/gemv_check.py: a [40, 300] float32 weight, splits 1, 2, 3
    and 8 (the last split shorter than the others), within 1e-5 of the reference, with and
    without bias, row-invariant, repeatable bit for bit, counters back to zero."""
    worst = float(run_interpreted(_CODE, timeout=300))
    assert 0 < worst < 1e-5


def test_deferred_split_k_sum_under_triton_interpreter():
    """check_deferred_sum("cpu") of tests/gemv_check.py: a [96, 2048] float32 weight split four
    ways, its partials summed by add_rms_norm bit-equal to the product summing them itself then
    the norm, for 1, 3 and 16 rows; unsplit or biased products return the tensor."""
    assert int(run_interpreted(_DEFERRED, timeout=300)) == 3
