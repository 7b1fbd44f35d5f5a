"""The skinny product's split-K reduction and SwiGLU epilogue (kernels/gemv_triton.py) on the
CPU under Triton's interpreter (float32, in a subprocess: tests/interpreted.py). The same checks
in bfloat16 on CUDA: tests/test_gpu.py."""

from __future__ import annotations

import pytest

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


_PRELOAD = """
import gemv_check
print("RESULT", gemv_check.check_preload("cpu"))
"""


def test_preloaded_tiles_under_triton_interpreter():
    """check_preload("cpu") of tests/gemv_check.py: whole tiles loaded before the PDL wait and
    multiplied row by row, [40, 300] (one tile of 512 inputs, masked) and [96, 2048] (4 tiles
    of 512) float32 weights, within 1e-5 of the reference, with and without bias,
    row-invariant, repeatable, deferred partials summing to the same bits; a tile shorter than
    its share refused."""
    worst = float(run_interpreted(_PRELOAD, timeout=300))
    assert 0 < worst < 1e-5


_STREAM = """
import gemv_check
print("RESULT", gemv_check.check_stream("cpu"))
"""


def test_streamed_one_row_product_under_triton_interpreter():
    """check_stream("cpu") of tests/gemv_check.py: the streamed one-row product over [40, 256],
    [100, 512] and [33, 64] float32 weights in units of 16 x 64, 8 x 512 and 16 x 32 over 3, 7
    and 1 programs, within 1e-5 of the reference with and without bias, the same bits for 1, 5
    and those programs, its SwiGLU store equal to silu_and_mul of the plain one, gemv's dispatch
    with STREAM on; two rows or chunks that do not divide K refused."""
    worst = float(run_interpreted(_STREAM, timeout=300))
    assert 0 < worst < 1e-5


_FUSED_INPUTS = """
import gemv_check
print("RESULT", gemv_check.check_stream_fused_inputs("cpu"))
"""


def test_streamed_product_with_fused_inputs_under_triton_interpreter():
    """check_stream_fused_inputs("cpu") of tests/gemv_check.py: the streamed product taking
    SiLU-and-mul of [gate | up] gives the same bits as silu_and_mul then the product, taking
    a residual add + RMSNorm is within 1e-5 of add_rms_norm then the product with the new
    residual bit-equal, and taking a Gated DeltaNet's output norm within 1e-5 of gated_rms_norm
    then the product, over [40, 256] and [100, 512] float32 weights, and in bfloat16 the same
    bits as gated_rms_norm then the product: 7 cases."""
    assert int(run_interpreted(_FUSED_INPUTS, timeout=300)) == 7


_SWIGLU = """
import gemv_check
print("RESULT", gemv_check.check_swiglu("cpu"), gemv_check.check_silu_interleaved("cpu"))
"""

_INTERLEAVED_MODEL = """
import gemv_check
print("RESULT", gemv_check.check_interleaved_model()["swiglu_epilogues"])
"""


def test_swiglu_epilogue_under_triton_interpreter():
    """check_swiglu("cpu") and check_silu_interleaved("cpu") of tests/gemv_check.py: the SwiGLU
    epilogue over interleaved [72, 80] and [256, 64] weights for 1, 3 and 16 rows, float32 and
    bfloat16 outputs, bit-equal to the product then silu_and_mul (over the checkpoint order, and
    over the interleaved order with ``interleaved=True``); silu_and_mul(interleaved=True) equal
    to the plain one on the permuted columns, float32 and bfloat16."""
    assert run_interpreted(_SWIGLU, timeout=300).split() == ["12", "4"]


def test_swiglu_epilogue_rejects_what_it_cannot_take():
    """A bias, a split reduction or an odd number of weight rows raise ValueError before any
    launch; swiglu_fits holds for the 8B and 1.7B gate/up shapes, with SWIGLU_MIN_K at 4096
    for the 8B one and the 135M one (not streamed at one row) only, never for a split one or
    with SWIGLU_EPILOGUE off."""
    pytest.importorskip("triton")
    import gemv_check

    assert gemv_check.check_swiglu_errors("cpu") == 3


def test_interleaved_gate_up_model_gives_the_same_logits_under_triton_interpreter():
    """check_interleaved_model() of tests/gemv_check.py: a tiny Qwen3's logits (9-token prefill
    + 3 decode steps on the skinny product, and an 18-token prefill off it) bit-equal before and
    after its gate/up rows are interleaved, the SwiGLU epilogue on (8 fused products) and off."""
    assert int(run_interpreted(_INTERLEAVED_MODEL, timeout=300)) == 8
