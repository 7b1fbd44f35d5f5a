"""The fused MoE routing (kernels/moe_router_triton.py) and SparseMoeBlock's router merge on the
CPU: the kernel and the block's Triton path under Triton's interpreter (float32, in a subprocess,
since TRITON_INTERPRET must be set before a kernel is defined), the reference routing against the
block's PyTorch path, and the CPU block left as it was (separate parameters, checkpoint names).
The same checks in float32 and bfloat16 on CUDA: tests/test_gpu.py."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))

from interpreted import run_interpreted  # noqa: E402
from moe_router_check import block_cfg, block_weights, route_ref  # noqa: E402

from mtpserve.layers.moe import SparseMoeBlock  # noqa: E402
from mtpserve.models.weights import check_all_loaded, load_weights  # noqa: E402

_INTERPRETED = """
import json
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import moe_router_triton
import moe_router_check as m
assert isinstance(moe_router_triton._route_kernel, InterpretedFunction)
out = {"route": m.check_route("cpu"), "block": m.check_block("cpu", rows=(1, 5)),
       "combine": m.check_combine("cpu"), "deferred": m.check_deferred_sum("cpu")}
print("RESULT " + json.dumps(out))
"""


def test_router_kernel_and_block_under_triton_interpreter():
    """check_route("cpu") and check_block("cpu") of tests/moe_router_check.py: exact ids, float32
    weights within 1e-6 of the reference (E in {64, 512}, k in {8, 10}, T in {1, 5, 64}, tied
    rows, with and without renormalising and the shared gate column), and the block's Triton path
    (merged router, and the unmerged fallback) within 1e-5 of its PyTorch path."""
    res = json.loads(run_interpreted(_INTERPRETED, timeout=300))
    assert 0 <= res["route"]["weights f32"] <= 1e-6 and res["route"]["gate f32"] <= 1e-6
    assert {n.rsplit(" ", 1)[0] for n in res["block"]} == {"block built float32",
                                                            "block moved float32"}
    assert all(0 < e < 1e-5 for e in res["block"].values()), res["block"]
    # the block's end (sum over choices + gated shared expert) in one kernel
    assert res["combine"]["combine bfloat16"] <= 1 and res["combine"]["combine float32"] <= 1e-6
    # a folded block's choices summed by the next norm: the combine kernel's bits
    assert res["deferred"] == 3


def test_moe_combine_refuses_operands_that_do_not_fit():
    pytest.importorskip("triton")
    from mtpserve.kernels.moe_combine_triton import moe_combine

    y, shared, gate = torch.zeros(16, 8), torch.zeros(2, 8), torch.zeros(2, 1)
    with pytest.raises(ValueError, match="not \\[T \\* k, 8\\]"):
        moe_combine(torch.zeros(15, 8), shared, gate)
    with pytest.raises(ValueError, match="not contiguous"):
        moe_combine(y, torch.zeros(8, 2).t(), gate)
    with pytest.raises(ValueError, match="dtypes differ"):
        moe_combine(y, shared, gate.double())
    assert moe_combine(y[:0], shared[:0], gate[:0]).shape == (0, 8)


def test_reference_routing_is_the_blocks_softmax_topk():
    """route_ref (stable sort of the logits) picks what softmax + torch.topk picks where no two
    logits are equal, with the same weights; on tied rows it takes the lowest indices."""
    from moe_router_check import tied_logits

    g = torch.Generator().manual_seed(0)
    for E, k, renorm in ((64, 8, False), (512, 10, True)):
        lg = torch.randn(33, E, generator=g)
        ids, w, _ = route_ref(lg, k, renorm)
        probs = torch.softmax(lg, -1)
        tw, tids = torch.topk(probs, k, dim=-1)
        if renorm:
            tw = tw / tw.sum(-1, keepdim=True)
        assert torch.equal(ids, tids) and torch.allclose(w, tw, rtol=0, atol=1e-7)
        tied = tied_logits(3, E, k, 1)
        ids, w, _ = route_ref(tied, k, renorm)
        assert ids[0].tolist() == list(range(k))
        assert torch.allclose(w[0], torch.full((k,), 1 / k if renorm else 1 / E))
        top = sorted([E - 1, 5, 30 % E])
        assert ids[1, :3].tolist() == top
        group = (tied[1] == 2.0).nonzero().flatten().tolist()
        assert len(group) == k and ids[1, 3:].tolist() == sorted(group)[:k - 3]
        assert ids[2].tolist() == [3, E // 2] + [i for i in range(E) if i not in (3, E // 2)][
            :k - 2]


def test_cpu_block_keeps_separate_router_parameters():
    """On the CPU nothing is merged: the checkpoint names load as before into two separate
    parameters, and the block's output is its plain PyTorch routing."""
    cfg = block_cfg(64, 8)
    b = SparseMoeBlock(cfg)
    weights = block_weights(cfg, 2)
    loaded = load_weights(b, weights)
    check_all_loaded(b, loaded)
    assert {"gate.weight", "shared_expert_gate.weight"} <= loaded
    assert b._router is None and b._merged_router() is None
    assert b.gate.weight.untyped_storage().data_ptr() != \
        b.shared_expert_gate.weight.untyped_storage().data_ptr()
    b.float()                                  # a move on the CPU merges nothing either
    assert b._router is None
    w = dict(weights)
    assert torch.equal(b.gate.weight, w["gate.weight"])
    assert torch.equal(b.shared_expert_gate.weight, w["shared_expert_gate.weight"])
    x = torch.randn(3, cfg.hidden_size, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        logits = F.linear(x, w["gate.weight"])
        p = torch.softmax(logits, -1)
        tw, tids = p.topk(8, -1)
        tw = tw / tw.sum(-1, keepdim=True)      # block_cfg renormalises by default
        want = b.experts(x, tids, tw) + b.shared_expert(x) * torch.sigmoid(
            F.linear(x, w["shared_expert_gate.weight"]))
        assert torch.equal(b(x), want)


def test_merged_router_is_a_view_that_loading_writes_through():
    """merge_router_weights (done on CUDA at construction) on the CPU: one [E + 1, H] tensor,
    both parameters views of it, values kept, later checkpoint loads land in it; a deep copy
    comes out unmerged (so the block takes its two-product fallback)."""
    import copy

    cfg = block_cfg(64, 8)
    b = SparseMoeBlock(cfg)
    load_weights(b, block_weights(cfg, 3))
    before = torch.cat([b.gate.weight, b.shared_expert_gate.weight]).clone()
    w = b.merge_router_weights()
    assert w.shape == (65, cfg.hidden_size) and torch.equal(w, before)
    assert b._merged_router() is w and b.merge_router_weights() is w
    new = dict(block_weights(cfg, 4))
    load_weights(b, [(n, new[n]) for n in ("gate.weight", "shared_expert_gate.weight")])
    assert torch.equal(w[:64], new["gate.weight"])
    assert torch.equal(w[64:], new["shared_expert_gate.weight"])
    assert copy.deepcopy(b)._merged_router() is None
