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
        return bench.run(bench.build("tiny-qwen3-next", "cpu", None), NEW).tokens


@pytest.mark.parametrize("accept", [0, 2, 3])
def test_forced_acceptance_accepts_exactly_that_many(reference, accept):
    with one_thread():
        eng = bench.build("tiny-qwen3-next", "cpu",
                          SpeculativeConfig(algorithm="nextn", num_steps=K, adaptive=False))
        bench.force_acceptance(eng, reference, accept)
        tokens = bench.run(eng, NEW).tokens
    assert tokens == reference
    m = eng.spec_metrics
    hist = list(m.accepted_per_step)   # verify steps by drafts accepted
    # every verify step accepts exactly a, but the last ones, whose budget max_tokens cut below a
    assert m.num_verify_steps >= 3 and sum(hist[accept + 1:]) == 0
    assert hist[accept] >= m.num_verify_steps - 2


def test_forcing_settles_on_the_engines_own_output(reference):
    """A reference that leaves the engine's greedy output (as a bf16 near tie would) is replaced
    by the engine's output, and the forcing then holds: every verify step accepts exactly 2."""
    wrong = list(reference)
    wrong[5] = (wrong[5] + 1) % 500
    with one_thread():
        eng = bench.build("tiny-qwen3-next", "cpu",
                          SpeculativeConfig(algorithm="nextn", num_steps=K, adaptive=False))
        got, ref = bench.forced_run(eng, wrong, 2, NEW)
        tokens = got.tokens
        m = eng.spec_metrics
        before, steps = list(m.accepted_per_step), m.num_verify_steps
        again = bench.run(eng, NEW).tokens   # the forcing left in place: the settled one
    assert tokens == ref == reference == again
    hist = [x - y for x, y in zip(m.accepted_per_step, before)]
    assert sum(hist[3:]) == 0 and hist[2] >= m.num_verify_steps - steps - 2 >= 3


def test_divergence_names_the_first_difference_and_its_margin():
    assert bench.divergence([4, 5, 6], [4, 5, 6], [0.1, 0.2, 0.3])["diverged_at"] is None
    d = bench.divergence([4, 5, 6, 7], [4, 5, 9, 7], [0.1, 0.2, 0.003, 0.3])
    assert (d["diverged_at"], d["margin"]) == (2, 0.003)


def test_adaptive_levels_each_start_from_a_fresh_gate():
    """--adaptive: the load gate (CUDA-only in the server) learns per batch size, so what it
    learned at one acceptance level (drafting loses at a = 0) would veto the next; each level
    starts from an empty gate with the same settings (the gate itself times steps, so its
    effect is shown by the benchmark, not here)."""
    from mtpserve.spec.load_gate import LoadGate

    with one_thread():
        eng = bench.build("tiny-qwen3-next", "cpu",
                          SpeculativeConfig(algorithm="nextn", num_steps=K, adaptive=True))
    policy = eng.proposer.policy
    bench.fresh_gate(eng)   # the CPU engine has none: nothing to do
    assert policy.gate is None
    old = policy.gate = LoadGate(probe_every=7, decay=0.6, probe_steps=3)
    old.record(1, True, 1, 0.01)
    old.record(1, False, 1, 0.001)
    bench.fresh_gate(eng)
    new = policy.gate
    assert new is not old and (new.probe_every, new.decay, new.probe_steps) == (7, 0.6, 3)
    assert new._buckets == {} and old._buckets[0].rate == {True: 100.0, False: 1000.0}
