"""The persistent SwiGLU MLP kernel (kernels/mlp_triton.py) on the CPU under Triton's interpreter
(float32, its two phases as two launches, in a subprocess: tests/interpreted.py), and its tile
plan. The one-launch kernel with its grid barrier, in bfloat16: tests/test_gpu.py."""

from __future__ import annotations

from interpreted import run_interpreted

_CODE = """
import mlp_check
print("RESULT", mlp_check.check_swiglu_mlp("cpu"))
"""


def test_persistent_mlp_under_triton_interpreter():
    """check_swiglu_mlp("cpu") of tests/mlp_check.py: K 64, I 256, N 40 over 3 programs (each
    several gate/up tiles and down items), 1, 3 and 16 rows: partials bit-equal to the skinny
    product's with the same tiles, within 1e-5 of a float64 reference, row-invariant."""
    assert int(run_interpreted(_CODE, timeout=300)) == 3


def test_plan_fills_the_programs_of_an_h200():
    """264 programs (2 per SM of an H200): the 1.7B MLP's 12288 gate/up rows in 16-row tiles
    (768 tiles, 3 rounds of 256-264), its down product in 32-row tiles split four ways (256
    items); the 8B's in 32-row tiles (768) and 32 x 4 (512); a reduction too short to split
    runs unsplit."""
    from mtpserve.kernels.mlp_triton import plan

    assert plan(12288, 2048, 2048, 264) == dict(a_block_n=16, a_block_k=256, b_block_n=32,
                                                b_block_k=128, b_split=4)
    assert plan(24576, 4096, 4096, 264) == dict(a_block_n=32, a_block_k=128, b_block_n=32,
                                                b_block_k=128, b_split=4)
    assert plan(96, 64, 40, 4)["b_split"] == 1


def test_swiglu_mlp_rejects_what_it_cannot_take():
    """A down weight whose inputs are not half the gate/up rows, more than MAX_ROWS rows, or
    mixed dtypes raise ValueError naming the shapes."""
    import pytest
    import torch

    from mtpserve.kernels.mlp_triton import swiglu_mlp

    x, w_gu, w_d = torch.zeros(1, 8), torch.zeros(32, 8), torch.zeros(4, 16)
    for args in ((x, w_gu, torch.zeros(4, 15)), (torch.zeros(17, 8), w_gu, w_d),
                 (x.double(), w_gu, w_d)):
        with pytest.raises(ValueError, match="swiglu_mlp: x"):
            swiglu_mlp(*args)


_MODEL = """
import mlp_check
print("RESULT", mlp_check.check_persistent_model())
"""


def test_persistent_mlp_in_a_tiny_model_under_triton_interpreter():
    """check_persistent_model() of tests/mlp_check.py: a tiny Qwen3 (float32) with the
    persistent MLP on: 8 kernels (2 layers x (a 9-token prefill + 3 decode steps)), the
    logits of those and of an 18-token prefill within 1e-5 of the separate kernels' over the checkpoint's row order."""
    assert int(run_interpreted(_MODEL, timeout=300)) == 8


def test_one_round_plan_takes_the_skinny_products_gate_up_tiles():
    """On 132 SMs: the 1.7B MLP runs 384 programs (its 12288 gate/up rows in tile_config's 32-row
    tiles, one a program) and its down product in 32-row tiles split six ways (384 items); the
    8B's 384 programs of 64-row tiles, its down product 32 x 3; none past MAX_PER_SM a SM."""
    from mtpserve.kernels.mlp_triton import MAX_PER_SM, one_round_plan

    assert one_round_plan(12288, 2048, 2048, 132) == (384, dict(
        a_block_n=32, a_block_k=128, b_block_n=32, b_block_k=128, b_split=6))
    assert one_round_plan(24576, 4096, 4096, 132) == (384, dict(
        a_block_n=64, a_block_k=128, b_block_n=32, b_block_k=128, b_split=3))
    assert one_round_plan(12288, 2048, 2048, 384 // MAX_PER_SM - 1) is None
