"""GPU tests (skipped without CUDA) of the Gluon tensor-core stream for products of 2-16 rows
(kernels/gemv_tc_gluon.py) and of gemv_triton's routing to it."""

from __future__ import annotations

import pytest
import torch
from gemv_check import _rel

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available()
                                 or torch.cuda.get_device_capability()[0] < 9,
                                 reason="needs a Hopper or newer GPU (PDL)")]

# the 135M and 1.7B q/k/v, o, gate/up and down weights, one of N not a multiple of 16, and a
# tiny model's gate/up and o (K = 256: the shortest reduction tc_config halves into two units)
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (4096, 2048), (2048, 2048),
          (12288, 2048), (2048, 6144), (1000, 576), (4096, 256), (256, 2048)]
ROWS = (2, 3, 4, 8, 9, 16)


@pytest.mark.parametrize("n, k", SHAPES)
def test_tc_products_match_float32_and_are_row_invariant(n, k):
    """With tc_config's units: within 1e-2 of a float32 reference (bf16 output) at 2-16 rows;
    the first two rows bit-equal whatever the rows beside them (x padded to 8 or to 16 rows);
    ``swiglu=True`` over the weight as interleaved pairs bit-equal to the product then
    ``silu_and_mul(interleaved=True)``; ``gemv`` gives it 2..TC_MAX_ROWS rows (the same bits),
    not one row nor more."""
    from mtpserve.kernels import gemv_triton
    from mtpserve.kernels.fused_triton import silu_and_mul
    from mtpserve.kernels.gemv_stream_triton import sm_count
    from mtpserve.kernels.gemv_tc_gluon import gemv_tc, tc_config

    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.05).bfloat16()
    x = torch.randn(16, k, device="cuda", generator=g).bfloat16()
    ref = x.float() @ w.float().t()
    cfg = tc_config(n, k, sm_count(0))
    first = None
    for m in ROWS:
        y = gemv_tc(x[:m], w, **cfg)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16
        assert _rel(y, ref[:m]) < 1e-2, (m, _rel(y, ref[:m]))
        first = y[:2] if first is None else first
        assert torch.equal(y[:2], first), m
        assert gemv_triton.tc_fits(x[:m], w) == (m <= gemv_triton.TC_MAX_ROWS)
        if m <= gemv_triton.TC_MAX_ROWS:
            assert torch.equal(gemv_triton.gemv(x[:m], w), y), m
        assert torch.equal(gemv_tc(x[:m], w, swiglu=True, **cfg),
                           silu_and_mul(y, interleaved=True)), m
    assert not gemv_triton.tc_fits(x[:1], w)


def test_tc_refuses_what_it_does_not_take():
    """``gemv_tc`` raises ValueError for 17 rows, float32, an odd number of rows under
    ``swiglu``, an x whose rows are not 16-byte aligned, 4 accumulators, a unit not a power of
    two, and a single unit (Triton 3.6 cannot build its loop); ``gemv`` keeps its tiles for those,
    for a bias, for float32 outputs and for more than TC_MAX_N outputs, and gives the same
    product within bf16 rounding."""
    from mtpserve.kernels import gemv_triton
    from mtpserve.kernels.gemv_tc_gluon import gemv_tc

    w = (torch.randn(256, 512, device="cuda") * 0.05).bfloat16()
    x = torch.randn(17, 520, device="cuda").bfloat16()
    xs = x[:4, 8:]   # rows 1040 bytes apart: a stride of 520, not a multiple of 16
    x4 = x[:4, :512].contiguous()
    bad = [lambda: gemv_tc(x[:, :512].contiguous(), w), lambda: gemv_tc(x4.float(), w.float()),
           lambda: gemv_tc(x4, w[:255].contiguous(), swiglu=True), lambda: gemv_tc(xs, w),
           lambda: gemv_tc(x4, w, nacc=4), lambda: gemv_tc(x4, w, block_k=96),
           lambda: gemv_tc(x4, w, block_k=512)]
    for call in bad:
        with pytest.raises(ValueError, match="gemv_tc"):
            call()
    assert not gemv_triton.tc_fits(xs, w)
    ref = xs.float() @ w.float().t()
    assert _rel(gemv_triton.gemv(xs, w), ref) < 1e-2
    assert gemv_triton.tc_fits(x4, w)
    b = torch.randn(256, device="cuda").bfloat16()
    assert _rel(gemv_triton.gemv(x4, w, b), x4.float() @ w.float().t() + b.float()) < 1e-2
    assert gemv_triton.gemv(x4, w, out_dtype=torch.float32).dtype == torch.float32
    head = torch.empty(gemv_triton.TC_MAX_N + 16, 512, device="cuda", dtype=torch.bfloat16)
    assert not gemv_triton.tc_fits(x4, head)


def test_tiny_model_with_tc_products(tmp_path):
    """A tiny Qwen3 (bf16): prompt logits of 6 tokens (eager; 6-row products) within 1% of
    those through the tiles (and not equal: the stream ran), and the greedy tokens of two
    requests through CUDA graphs (2-row decode products) with TC on and off equal but at
    near-ties (random weights: the two kernels round differently)."""
    from harness import logits_of_prompt
    from test_gpu import NEAR_TIE, _greedy, _margin_report, _switched, _tiny_qwen3_llm

    from mtpserve.kernels import gemv_triton

    llm = _tiny_qwen3_llm(tmp_path)
    prompts = [[5, 9, 33, 2, 71, 8], list(range(2, 40))]

    def outputs(on: bool):
        with _switched(llm, gemv_triton, "TC", on):
            return logits_of_prompt(llm.engine, prompts[0]), _greedy(llm, prompts, 24)

    tc, tiles = outputs(True), outputs(False)
    assert 0 < _rel(tc[0], tiles[0]) < 1e-2
    flips = [_margin_report(llm, p, a, b) for p, a, b in zip(prompts, tc[1], tiles[1]) if a != b]
    assert all(m < NEAR_TIE for _, m in flips), f"divergences (token, top-2 margin): {flips}"
