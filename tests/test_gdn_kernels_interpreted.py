"""The Gated DeltaNet layer's Triton path for prefill chunks of 17-256 tokens (padded groups per
length bucket, layers/linear_attention.py) against its PyTorch path, on the CPU under Triton's
interpreter (in a subprocess: tests/interpreted.py). The whole kernel check runs on CUDA in
tests/test_gpu.py; here only the medium-prefill step, with shorter chunks than on CUDA (the
same buckets' code, see gdn_kernel_check.check_medium_prefill): ~18 s interpreted."""

from __future__ import annotations

from interpreted import run_interpreted

_CODE = """
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import gated_delta_rule_triton as gdn
import gdn_kernel_check
assert isinstance(gdn._recurrent_kernel, InterpretedFunction)
errors = {}
gdn_kernel_check.check_medium_prefill("cpu", errors)
print("RESULT", errors["layer out torch.float32"], errors["layer ssm slots torch.float32"])
"""


def test_medium_prefill_groups_match_the_chunked_form_under_triton_interpreter():
    """Output and SSM states within float32 rounding of the chunked form (the conv states are
    compared exactly inside the check)."""
    out, ssm = (float(x) for x in run_interpreted(_CODE, timeout=300).split())
    assert out < 1e-5 and ssm < 1e-5
