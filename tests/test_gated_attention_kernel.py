"""Gated attention's CUDA path on the CPU under Triton's interpreter (in a subprocess:
tests/interpreted.py): the output gate kernel (kernels/output_gate_triton.py) and the whole
layer (q/k norm + partial RoPE + K/V write with gated queries, attention, the gate) against the
layer's PyTorch path (tests/gated_attention_check.py). The same checks on CUDA: tests/test_gpu.py."""

from __future__ import annotations

import json

import pytest

from interpreted import run_interpreted

_CODE = """
import json
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import output_gate_triton
import gated_attention_check as c
assert isinstance(output_gate_triton._output_gate_kernel, InterpretedFunction)
print("RESULT", json.dumps({**c.check_output_gate("cpu"), **c.check_gated_attention("cpu")}))
"""


def test_gated_attention_cuda_path_under_triton_interpreter():
    """Keys and outputs within the fused norm's tolerance (interpreted with CUDA's bfloat16
    rounding they come out within an ulp), values and the output gate exact to an ulp."""
    worst = json.loads(run_interpreted(_CODE, timeout=300))
    assert worst["output_gate[bfloat16]"]["max_ulps"] <= 1
    assert worst["gated_attention_v_cache[bfloat16]"]["max_ulps"] == 0
    assert worst["gated_attention_out[float32]"]["rel_to_max"] <= 1e-5
    assert worst["gated_attention_k_cache[bfloat16]"]["max_ulps"] <= 1


def test_output_gate_refuses_a_mismatched_gate():
    pytest.importorskip("triton")
    import torch

    from mtpserve.kernels.output_gate_triton import output_gate_

    out = torch.zeros(2, 8)
    with pytest.raises(ValueError, match=r"\[T, Hq \* D\]"):
        output_gate_(out, torch.zeros(2, 2, 8))        # 16 channels a row against 8
    with pytest.raises(ValueError, match="unit stride"):
        output_gate_(out, torch.zeros(2, 8, 2).transpose(1, 2))
