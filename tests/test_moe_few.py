"""The few-token expert kernels (kernels/fused_moe_few.py) on the CPU under Triton's
interpreter: the same bits as one block per row, each routed expert's weights read once, and
the errors raised. The same checks on CUDA: tests/test_gpu.py."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from interpreted import run_interpreted  # noqa: E402

_INTERPRETED = """
import json
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import fused_moe_few
import moe_few_check as m
assert isinstance(fused_moe_few._gate_up_few_kernel, InterpretedFunction)
print("RESULT " + json.dumps({"few": m.check_few_tokens("cpu"),
                              "probe": m.check_tokens_of_expert("cpu")}))
"""


def test_few_token_experts_under_triton_interpreter():
    """Every case of tests/moe_few_check.py: bits equal to the one-row blocks, within 1e-5 of
    the per-expert loop; the cases do share experts (so the gathering is exercised)."""
    res = json.loads(run_interpreted(_INTERPRETED, timeout=300))["few"]
    assert res["T=2 k=8 E=8"][0] == 8          # every expert chosen by both tokens
    assert res["T=16 k=2 E=4"][0] == 28        # 32 rows over 4 experts
    assert res["T=4 k=8 E=64"][0] > 0
    for case, (_, equal, err) in res.items():
        assert equal, case
        assert 0 < err < 1e-5, (case, err)


def test_each_expert_has_one_first_row_that_gathers_its_tokens():
    """_tokens_of_expert on ids [[5, 7], [7, 5], [2, 9]]: the first row of experts 5 and 7
    (rows 0 and 1) gathers both tokens' rows (token 0's choice and token 1's); the repeats
    (rows 2, 3) do nothing; experts 2 and 9 (token 2 alone) gather one row each."""
    got = json.loads(run_interpreted(_INTERPRETED, timeout=300))["probe"]
    assert got == {"0": [5, 1, [0, 3, 0], [1, 1, 0]],
                   "1": [7, 1, [1, 2, 0], [1, 1, 0]],
                   "2": [7, 0, [1, 2, 0], [1, 1, 0]],
                   "3": [5, 0, [0, 3, 0], [1, 1, 0]],
                   "4": [2, 1, [0, 0, 4], [0, 0, 1]],
                   "5": [9, 1, [0, 0, 5], [0, 0, 1]]}


def test_shared_rows_counts_repeats():
    from moe_few_check import shared_rows

    assert shared_rows(torch.tensor([[0, 1], [1, 2], [0, 1]])) == 3
    assert shared_rows(torch.tensor([[5, 6, 7]])) == 0


def test_too_many_tokens_is_refused():
    pytest.importorskip("triton")
    from mtpserve.kernels.fused_moe_few import MAX_TOKENS, few_token_experts
    from mtpserve.kernels.fused_moe_triton import MoETiles

    T = MAX_TOKENS + 1
    with pytest.raises(ValueError, match=f"at most {MAX_TOKENS} tokens, got {T}"):
        few_token_experts(torch.zeros(T, 8), torch.zeros(T, 2, dtype=torch.int64),
                          torch.zeros(T, 2), torch.zeros(4, 8, 8), torch.zeros(4, 8, 4),
                          MoETiles())


@pytest.mark.parametrize("down", [False, True])
def test_few_token_kernels_compile_for_hopper(down):
    """Both kernels compile for sm_90 with PDL at the hybrid's shape (no GPU needed): the
    interpreter accepts some code the compiler refuses."""
    pytest.importorskip("triton")
    from moe_few_check import compile_for_hopper

    try:
        meta = compile_for_hopper(down)
    except RuntimeError as e:              # no ptxas / LLVM backend in this Triton install
        if "ptxas" in str(e).lower():
            pytest.skip(str(e))
        raise
    assert meta["num_warps"] == 4
