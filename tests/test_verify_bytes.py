"""benchmarks/verify_bytes.py: the expected distinct experts against an enumeration, the weight
groups of the Qwen3-Next-like shape against numbers worked out by hand, and the floors."""

from __future__ import annotations

import itertools
import os
import sys
from fractions import Fraction

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))

import verify_bytes as vb  # noqa: E402


@pytest.mark.parametrize("experts,top_k,tokens", [(5, 2, 3), (4, 1, 2), (6, 3, 1), (4, 4, 2)])
def test_expected_distinct_matches_an_enumeration(experts, top_k, tokens):
    choices = list(itertools.combinations(range(experts), top_k))
    combos = list(itertools.product(choices, repeat=tokens))
    mean = Fraction(sum(len(set().union(*c)) for c in combos), len(combos))
    assert vb.expected_distinct(experts, top_k, tokens) == pytest.approx(float(mean), abs=1e-12)


def test_expected_distinct_refuses_top_k_over_experts():
    with pytest.raises(ValueError, match="top_k <= experts"):
        vb.expected_distinct(4, 5, 1)


@pytest.fixture(scope="module")
def groups():
    from mtpserve.bench.random_model import checkpoint_shapes, hf_config

    return vb.weight_groups(checkpoint_shapes(hf_config("qwen3-next-3b")), 64)


def test_weight_groups_of_the_hybrid_shape(groups):
    # elements, by hand from the shape (H 2048, 9 Gated DeltaNet + 3 attention layers):
    # Gated DeltaNet layer: qkvz 12288 x 2048, ba 64 x 2048, conv 8192 x 4, out 2048 x 4096,
    #   A_log 32, dt_bias 32, norm 128                                        = 33,718,464
    # attention layer: q 8192 x 2048, k / v 512 x 2048, o 2048 x 4096, q/k norms 256 each
    #                                                                         = 27,263,488
    # every layer: 2 norms 4096, router 64 x 2048, shared expert 3 x 2048 x 512, its gate 2048
    #                                                                         =  3,282,944
    # 9 x 37,001,408 + 3 x 30,546,432 + final norm 2048 = 424,654,016 elements, 2 bytes each
    assert groups.dense == 849_308_032
    assert groups.expert == 3 * 2048 * 512 * 2
    assert groups.moe_layers == 12 and groups.mtp_moe_layers == 1
    assert groups.head == 151936 * 2048 * 2
    assert groups.row == 2048 * 2
    # mtp: fc 2048 x 4096, 3 norms, one attention layer with its shared expert, router, norms
    assert groups.mtp_dense == 2 * (2048 * 4096 + 3 * 2048 + 27_263_488 + 3_282_944)


def test_step_bytes_and_floors(groups):
    full = vb.step_bytes(groups, 64, 8, 3)
    mapped = vb.step_bytes(groups, 64, 8, 3, token_map_size=32768)
    per_expert_layer = 12 * groups.expert
    assert full.decode == groups.dense + groups.head + groups.row + 8 * per_expert_layer
    # 64 (1 - (7/8)^4) = 26.484375 distinct experts among 4 tokens
    assert full.target_verify - full.decode == 3 * groups.row + 18.484375 * per_expert_layer
    mtp_pass = groups.mtp_dense + groups.row + 8 * groups.expert
    assert full.drafts == 3 * (mtp_pass + groups.head)
    assert mapped.drafts == 3 * (mtp_pass + 32768 * 2048 * 2)
    assert mapped.step == 4_258_465_152
    # after a 1.197 ms decode step's worth of verify, the drafts at 4.8 TB/s:
    # 0.787 GB -> 0.164 ms (FR-Spec), 2.252 GB -> 0.469 ms (full head)
    assert vb.ratio_floor(mapped, 1.197, 4.8e12) == pytest.approx(1.1370, abs=1e-4)
    assert vb.ratio_floor(full, 1.197, 4.8e12) == pytest.approx(1.3919, abs=1e-4)
    # 1.15x leaves the drafts 0.18 ms: 4.38 TB/s (FR-Spec), 12.5 TB/s (full head)
    assert vb.drafts_bandwidth_for(mapped, 1.197, 1.15) == pytest.approx(4.3849e12, rel=1e-4)
    assert vb.drafts_bandwidth_for(full, 1.197, 1.15) == pytest.approx(12.5405e12, rel=1e-4)
