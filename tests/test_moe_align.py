"""The sort by expert in one Triton kernel (``align_by_expert_triton``, kernels/fused_moe_triton.py)
on the CPU: under Triton's interpreter (in a subprocess, since TRITON_INTERPRET must be set before
a kernel is defined), equal to the PyTorch reference on the edge cases of tests/moe_align_check.py,
and the expert kernels fed by it; the reference against the layout's definition. The same cases on CUDA: tests/test_gpu.py."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from interpreted import run_interpreted  # noqa: E402
from moe_align_check import cases, check_layout  # noqa: E402

from mtpserve.kernels.fused_moe_triton import align_by_expert, align_by_expert_torch  # noqa: E402

_INTERPRETED = """
import json
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import fused_moe_triton
import moe_align_check as m
assert isinstance(fused_moe_triton._align_kernel, InterpretedFunction)
out = {"align": m.check_align("cpu", random_sizes=((128, 10, 512), (300, 8, 64))),
       "dispatch": m.check_dispatch("cpu"), "fused": m.check_fused_experts("cpu"),
       "sliced": m.check_sliced_ids("cpu")}
print("RESULT " + json.dumps(out))
"""


def test_align_kernel_under_triton_interpreter():
    """check_align("cpu") and check_dispatch("cpu") of tests/moe_align_check.py: rows and
    block_expert equal to align_by_expert_torch for every case (one row; below, at and above one
    chunk; empty experts; all rows to one expert; E = 64 top 8, E = 512 top 10 at 128 tokens;
    block sizes 16 and 64), the errors raised, and align_by_expert taking the kernel up to its
    row limit only; fused_experts through the kernel within 1e-5 of the per-expert loop, also
    given ids sliced to one column (check_sliced_ids)."""
    res = json.loads(run_interpreted(_INTERPRETED, timeout=300))
    assert len(res["align"]) == len(cases()) + 4
    assert res["align"]["random T=128 k=10 E=512 bm=64"] == 33536
    assert res["dispatch"]["kernel calls"] == [200]
    assert len(res["fused"]) == 2 and all(0 < e < 1e-5 for e in res["fused"].values())
    assert len(res["sliced"]) == 5 and all(0 < e < 1e-5 for e in res["sliced"].values())


def test_reference_layout_on_the_cases():
    """align_by_expert_torch (the reference) meets the layout's definition on every case, and
    is what align_by_expert gives on the CPU without the interpreter."""
    for name, ids, E, bm, _ in cases():
        rows, be = align_by_expert_torch(ids, E, bm)
        check_layout(rows, be, ids, E, bm)
        r2, b2 = align_by_expert(ids, E, bm)
        assert torch.equal(rows, r2) and torch.equal(be, b2), name


def test_layout_check_catches_an_unstable_order():
    """check_layout fails when two rows of one expert swap places."""
    ids = torch.full((3, 2), 4)
    rows, be = align_by_expert_torch(ids, 8, 16)
    rows = rows.clone()
    rows[[0, 1]] = rows[[1, 0]]
    with pytest.raises(AssertionError):
        check_layout(rows, be, ids, 8, 16)


@pytest.mark.parametrize("experts, block_m, rows", [(512, 64, 1280), (64, 16, 64),
                                                    (512, 64, 16384)])
def test_align_kernel_compiles_for_hopper(experts, block_m, rows):
    """The kernel compiles for sm_90 with PDL (no GPU needed): a constexpr reassigned in a
    static_range loop once passed the interpreter and failed to compile on the H200."""
    from moe_align_check import compile_for_hopper

    try:
        meta = compile_for_hopper(experts, block_m, rows)
    except RuntimeError as e:              # no ptxas / LLVM backend in this Triton install
        if "ptxas" in str(e).lower():
            pytest.skip(str(e))
        raise
    assert meta["num_warps"] == 8


def test_moe_tiles_launch_options():
    """The expert kernels' launch options: the warps always, the pipeline depth only when set
    (None leaves Triton's default)."""
    from mtpserve.kernels.fused_moe_triton import MoETiles
    assert MoETiles().launch() == {"num_warps": 4}
    assert MoETiles(32, 256, 128, 128, 8, 2).launch() == {"num_warps": 8, "num_stages": 2}
