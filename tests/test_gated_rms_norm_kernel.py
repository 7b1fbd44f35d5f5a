"""The Gated DeltaNet output norm kernel (kernels/fused_triton.py ``gated_rms_norm``) on the CPU
under Triton's interpreter (in a subprocess: tests/interpreted.py), against the layer's PyTorch
path. The same check on CUDA: tests/test_gpu.py."""

from __future__ import annotations

from interpreted import run_interpreted

_CODE = """
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import fused_triton
import fused_kernel_check
assert isinstance(fused_triton._gated_rms_norm_kernel, InterpretedFunction)
worst = fused_kernel_check.check_gated_rms_norm("cpu")
print("RESULT", worst["gated_rms_norm_vs_cpu[bfloat16]"]["max_ulps"],
      worst["gated_rms_norm_vs_cpu[float32]"]["rel_to_max"])
"""


def test_gated_rms_norm_under_triton_interpreter():
    """float32 within 1e-6 of the largest value; bfloat16 (CUDA's rounding) at most one ulp
    from the PyTorch path (the float32 sum of squares in another order)."""
    ulps, rel = run_interpreted(_CODE, timeout=300).split()
    assert int(ulps) <= 1 and float(rel) <= 1e-6
