"""Every Triton kernel of the tiny hybrid's MTP engine steps compiles for sm_90 (H100 / H200)
without a GPU (tests/hopper_compile_check.py): launches recorded under the interpreter in a
subprocess, compiled here with a fresh Triton cache."""

from __future__ import annotations

import json

import pytest
from interpreted import run_interpreted

_RECORD = """
import json
import hopper_compile_check as h
print("RESULT " + json.dumps(h.record_launches()))
"""

# every kernel the two configurations launch (folded shared expert; unfolded, combine kernel),
# and the streamed one-row product with its fused inputs
KERNELS = {
    "_accept_kernel", "_add_rms_norm_kernel", "_argmax_kernel", "_combine_kernel",
    "_commit_kernel", "_conv_kernel", "_down_kernel", "_embed_rms_norm_kernel",
    "_gate_up_kernel",
    "_gated_rms_norm_kernel", "_output_gate_kernel", "_qk_norm_rope_kv_kernel",
    "_recurrent_kernel", "_rms_norm_kernel", "_route_kernel", "_silu_mul_kernel",
    "_stream_kernel", "pair_kernel",
}


def test_mtp_engine_kernels_compile_for_hopper(monkeypatch, tmp_path):
    """Each distinct launch (kernel, argument dtypes and constexprs, launch options) of whole
    MTP engine steps compiles for sm_90 with CUDA's PDL and late bfloat16 widening: the set of
    kernels is the one named above, and the compiler refuses none."""
    launches = json.loads(run_interpreted(_RECORD, timeout=600))
    assert {launch["kernel"] for launch in launches} == KERNELS
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    from hopper_compile_check import compile_recorded

    try:
        result = compile_recorded(launches)
    except RuntimeError as e:              # no ptxas / LLVM backend in this Triton install
        if "ptxas" in str(e).lower():
            pytest.skip(str(e))
        raise
    assert result["failed"] == {}
    assert len(result["compiled"]) == len(launches)
