"""A tiny Qwen3-Next through every layer's CUDA path under Triton's interpreter against its
PyTorch path (tests/hybrid_path_check.py), with the shared expert folded into the routed
experts (as wide as one: it runs as their (k+1)-th choice and the next norm sums the choices)
and not (its own MLP, the combine kernel), and folded with each one-token Gated DeltaNet's
output norm inside its streamed out_proj (value heads of 16). The same model on CUDA:
tests/test_gpu.py."""

from __future__ import annotations

import json

from interpreted import run_interpreted

_CODE = """
import json
import hybrid_path_check as c
print("RESULT", json.dumps([c.check_model_paths(shared_expert_intermediate_size=32),
                            c.check_model_paths(),
                            c.check_model_paths(out_norm=True, shared_expert_intermediate_size=32,
                                                linear_value_head_dim=16)]))
"""


def test_hybrid_model_through_its_cuda_path_under_triton_interpreter():
    folded, unfolded, out_norm = json.loads(run_interpreted(_CODE, timeout=600))
    assert max(folded, unfolded, out_norm) <= 1e-4, (folded, unfolded, out_norm)
