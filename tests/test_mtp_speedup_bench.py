"""benchmarks/gpu_mtp_speedup.py's forced acceptance on the CPU (tiny random hybrid with an MTP
layer): with a of k drafts made right, every verify step accepts exactly a, the engine emits
plain decoding's tokens, and the MTP spec metrics count a per step."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))

from harness_hybrid import one_thread  # noqa: E402
from mtpserve.config import SpeculativeConfig  # noqa: E402

import gpu_mtp_speedup as bench  # noqa: E402

K, NEW = 3, 17


@pytest.fixture(scope="module")
def reference():
    with one_thread():
        return bench.run(bench.build("tiny-qwen3-next", "cpu", None), NEW)[0]


@pytest.mark.parametrize("accept", [0, 2, 3])
def test_forced_acceptance_accepts_exactly_that_many(reference, accept):
    with one_thread():
        eng = bench.build("tiny-qwen3-next", "cpu",
                          SpeculativeConfig(algorithm="nextn", num_steps=K, adaptive=False))
        bench.force_acceptance(eng, reference, accept)
        tokens, _, _ = bench.run(eng, NEW)
    assert tokens == reference
    m = eng.spec_metrics
    hist = list(m.accepted_per_step)   # verify steps by drafts accepted
    # every verify step accepts exactly a, but the last ones, whose budget max_tokens cut below a
    assert m.num_verify_steps >= 3 and sum(hist[accept + 1:]) == 0
    assert hist[accept] >= m.num_verify_steps - 2
