"""Acceptance pooled over requests (spec/shared_acceptance.py): where new requests' estimates
start, which ones are benched (never draft), and the scouts that keep the pool learning."""

from __future__ import annotations

import pytest

from mtpserve.engine.sequence import Sequence
from mtpserve.sampling_params import SamplingParams
from mtpserve.spec.policy import DraftLengthPolicy, GateArm
from mtpserve.spec.shared_acceptance import SharedAcceptance


def seq(rid):
    return Sequence(rid, [1, 2, 3], SamplingParams(), (), 100, None, None)


def test_pooled_estimate_is_the_prior_plus_decayed_evidence():
    s = SharedAcceptance(decay=0.5)
    assert s.estimate(0.8, 2.0) == 0.8
    s.record(3, 2)   # 2 successes of 3 trials (2 accepted, then a rejection)
    s.record(3, 0)   # 0 of 1
    assert (s.successes, s.trials) == (1.0, 2.5)
    assert s.estimate(0.8, 2.0) == pytest.approx((1.6 + 1.0) / 4.5, rel=1e-12)
    s.record(2, 2)   # all accepted: no rejection counted
    assert (s.successes, s.trials) == (2.5, 3.25)


def test_every_nth_priced_out_start_is_a_scout():
    s = SharedAcceptance(scout_every=3)
    assert [s.scout() for _ in range(7)] == [False, False, True, False, False, True, False]


def test_scouts_that_confirm_the_bench_come_ever_less_often():
    """A scout ending priced out doubles the interval (8, 16, 32, ... up to 128); one that
    found drafts paying brings it back to 8; the countdown follows the change."""
    s = SharedAcceptance(scout_every=8)

    def starts_to_next_scout():
        n = 1
        while not s.scout():
            n += 1
        return n

    gaps = []
    for pays in (False, False, False, False, False, True):
        gaps.append(starts_to_next_scout())
        s.scout_done(drafts_pay=pays)
    assert gaps == [8, 16, 32, 64, 128, 128] and s.max_scout_every == 128
    assert s.interval == 8 and starts_to_next_scout() == 8
    for _ in range(3):   # 3 starts into an interval of 8, then a scout confirms: 16 - 3
        s.scout()
    s.scout_done(drafts_pay=False)
    assert starts_to_next_scout() == 13
    assert (s.num_scouts, s.num_benched) == (8, 8 + 16 + 32 + 64 + 128 + 128 + 8 + 3 + 13 - 8)


@pytest.mark.parametrize("kw, msg", [(dict(decay=1.5), "decay must be in"),
                                     (dict(scout_every=0), "scout_every must be at least 1")])
def test_bad_settings_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SharedAcceptance(**kw)


def test_requests_start_benched_while_the_pooled_acceptance_is_priced_out():
    """An MTP-like policy (k 3, 0.27 plain steps per draft) whose first request had every
    draft rejected: new requests start from the pooled 0.236, where nothing pays, so they are
    benched (0 drafts whatever happens), except every 8th, a scout from the prior 0.8. Once
    the scout's drafts are accepted the pool recovers: the next request drafts again, while
    the benched ones stay benched."""
    p = DraftLengthPolicy(3, 0.27, prior=0.8, shared=SharedAcceptance())
    first = seq("first")
    for _ in range(10):
        p.record(first, 3, 0)
    pooled = 0.8 * 4 / (4 + sum(0.99 ** i for i in range(10)))
    assert p.pooled() == pytest.approx(pooled, rel=1e-12) and p.priced_out(pooled)
    assert not p.priced_out(0.3)
    new = [seq(f"r{i}") for i in range(1, 9)]
    assert [p.benched(s) for s in new] == [True] * 7 + [False]
    assert (p.shared.num_benched, p.shared.num_scouts) == (7, 1)
    assert p.shared.interval == 8
    bench, scout = new[0], new[7]
    assert p.acceptance(bench) == pytest.approx(pooled, rel=1e-12)
    assert p.num_drafts(bench) == p.would_draft(bench) == p.num_drafts_after(bench, 3, 3) == 0
    assert p.acceptance(scout) == 0.8 and p.num_drafts(scout) == 3
    for _ in range(20):
        p.record(scout, 3, 3)
    assert not p.priced_out(p.pooled())
    later = seq("later")
    assert not p.benched(later) and p.acceptance(later) == pytest.approx(p.pooled())
    assert p.num_drafts(later) == 3
    p.record(bench, 3, 3)   # (never happens: a benched request verifies no drafts)
    assert p.benched(bench) and p.num_drafts(bench) == 0
    p.forget(scout)   # it found drafts paying: the interval stays at 8
    assert p.shared.interval == 8


def test_a_scout_that_ends_priced_out_stretches_the_interval():
    p = DraftLengthPolicy(3, 0.27, prior=0.8, shared=SharedAcceptance())
    p.shared.trials = 1e6   # pooled acceptance ~0
    starts = [seq(f"r{i}") for i in range(8)]
    assert [p.benched(s) for s in starts] == [True] * 7 + [False]
    scout = starts[7]
    for _ in range(4):
        p.record(scout, 3, 0)
    assert p.priced_out(p.acceptance(scout))
    p.forget(starts[0])   # a benched request finishing changes nothing
    assert p.shared.interval == 8
    p.forget(scout)
    assert p.shared.interval == 16
    # a scout stopped after one rejected verify step (by the gate, say): its estimate is
    # still 0.49, not priced out, but its own evidence (0 of 1) is: it confirms the bench
    p.shared.interval = p.shared._until_scout = 1
    one = seq("one")
    assert not p.benched(one)
    p.record(one, 3, 0)
    assert p.acceptance(one) == pytest.approx(1.28 / 2.6) and not p.priced_out(1.28 / 2.6)
    p.forget(one)
    assert p.shared.interval == 2
    p.shared.interval = p.shared._until_scout = 16
    later = [seq(f"s{i}") for i in range(16)]   # the next scout: 16 starts later
    assert [p.benched(s) for s in later] == [True] * 15 + [False]
    p.forget(later[15])   # it never verified a draft (too short, aborted, vetoed): no evidence
    assert p.shared.interval == 16


def test_no_scouts_when_the_prior_itself_is_priced_out():
    """A scout starts from the configured prior: when that is priced out too (a draft as
    costly as a target step), it could not draft, so every start is benched and the countdown
    does not move."""
    p = DraftLengthPolicy(3, 1.1, prior=0.8, shared=SharedAcceptance(scout_every=2))
    assert p.priced_out(0.8)
    starts = [seq(f"r{i}") for i in range(5)]
    assert all(p.benched(s) for s in starts)
    assert (p.shared.num_benched, p.shared.num_scouts, p.shared._until_scout) == (5, 0, 2)


class _Veto:
    """A load gate that has measured drafting losing: it never lets a step draft."""

    def __init__(self):
        self.records = []

    def allow(self, num_seqs):
        return False

    def exploring(self, num_seqs):
        return False

    def record(self, num_seqs, drafted, tokens, seconds, switch=False):
        self.records.append((num_seqs, drafted))


def test_a_pool_priced_out_only_at_the_measured_price_benches_and_sends_scouts():
    """Measured drafting steps cost 3 plain steps (a hybrid MoE verify at batch 1 costs
    2.3-2.4), the cost model 1 + 0.1 m. A pool at ~0.34 pays at the model's price but at no
    measured one: before session 16 nobody was benched, no scout went out, and no request
    drafted (would_draft 0), so the pool never heard that drafts paid again. Now new requests
    start benched, every 8th a scout; the open scout drafts at the model's price (at the
    measured one even the prior 0.8 does not pay: E(3) = 2.95 < 3), its first verify of 3 of 3
    keeps it drafting at the measured price, and it ends reporting that drafts pay."""
    def cost(tokens, seqs):
        return 1.0 if tokens == seqs else 3.0

    p = DraftLengthPolicy(3, 0.1, prior=0.8, step_cost=cost, drafts_measured=lambda: True,
                          shared=SharedAcceptance())
    for _ in range(100):   # earlier requests' verify steps
        p.shared.record(3, 1)   # 1 success of 2 trials
        p.shared.record(3, 0)   # 0 of 1
    pooled = p.pooled()
    assert 0.33 < pooled < 0.36
    assert not p.priced_out(pooled, measured=False) and p.priced_out(pooled)
    assert p.priced_out(0.8) and not p.priced_out(0.8, measured=False)
    p.set_batch(1)
    new = [seq(f"n{i}") for i in range(8)]
    assert [p.benched(s) for s in new] == [True] * 7 + [False]
    scout = new[7]
    assert p.would_draft(scout) == p.num_drafts(scout) == 3
    assert p.num_drafts_after(scout, 0, 0) == 3   # drafting ahead plans as num_drafts answers
    p.record(scout, 3, 3)
    assert p.num_drafts(scout) == 3
    p.shared.interval = 32   # as after scouts that found drafts priced out
    p.forget(scout)
    assert p.shared.interval == 8


def test_a_start_is_priced_at_the_cheaper_of_batch_1_and_the_step():
    """A drafting overhead fixed per step weighs least at high load: priced at batch 1 alone,
    acceptance 0.55 benched nearly every request at 64 although drafting paid there (a fresh
    review: 13865 against 16590 tok/s in cpu_policy_sim --phases 64:0.6:6000)."""
    def cost(tokens, seqs):   # seconds: 1 + 0.01 per sequence, + 1.5 with drafts
        return 1 + 0.01 * seqs + (1.5 if tokens > seqs else 0.0)

    p = DraftLengthPolicy(3, 0.1, prior=0.8, step_cost=cost, drafts_measured=lambda: True,
                          shared=SharedAcceptance())
    p.set_batch(64)   # C(3) = 3.14 / 1.64 = 1.91 < E(3) = 2.02
    assert not p.priced_out(0.55)
    p.set_batch(1)    # C(3) = 2.51 / 1.01 = 2.49
    assert p.priced_out(0.55)


def test_an_open_scout_drafts_where_the_gate_vetoes_and_only_it():
    """Pool priced out, the gate vetoing: a scout that has verified no draft yet still drafts
    (3, priced by the model at the prior 0.8), the benched request and a request that started
    before the pool fell do not; once the scout has verified drafts the gate's veto holds for
    everyone; a scout forgotten before any verify closes too (else nothing would ever drain
    the count); the scout's own drafting step does not reach the gate. Without this, nothing
    drafts once the pool is priced out and the gate vetoes, so neither ever hears that drafts
    pay again (session 15's review)."""
    p = DraftLengthPolicy(3, 0.27, prior=0.8, gate=_Veto(), shared=SharedAcceptance(scout_every=2))
    early = seq("early")                  # started while the pool was at the prior
    assert not p.benched(early)
    p.shared.trials = 1e6                 # pooled acceptance ~0: starts are priced out
    bench, scout = seq("bench"), seq("scout")
    assert (p.benched(bench), p.benched(scout), p._est["scout"].scout) == (True, False, True)
    p.set_batch(3)
    assert p.allow_drafts()
    assert [p.num_drafts(s) for s in (early, bench, scout)] == [0, 0, 3]
    assert [p.would_draft(s) for s in (early, bench, scout)] == [0, 0, 3]
    arm = p.step_arm()                    # vetoed, open scouts alone may draft
    assert arm == GateArm(drafting=False, switch=False, scouts_only=True)
    plain = GateArm(drafting=False, switch=False, scouts_only=False)
    p.record_step(3, plain, 3, 0.01, synchronous=False)   # an earlier plain step read back now
    p.record_step(3, arm, 3, 0.02, synchronous=True)      # this step, the scout drafting: not
    p.record_step(3, arm, 3, 0.01, synchronous=False)     # as plain steps run: the plain arm
    assert p.gate.records == [(3, False), (3, False)]
    p.record(scout, 3, 0)                 # its first verify: evidence, so it is no longer open
    p.set_batch(3)
    assert not p.allow_drafts() and p._open_scouts == 0
    p.forget(scout)                       # its evidence priced out: the interval doubles
    assert p.shared.interval == 4
    later = [seq(f"n{i}") for i in range(4)]   # the countdown stretched to the interval of 4
    assert [p.benched(s) for s in later] == [True, True, True, False]
    assert p._est["n3"].scout and p._open_scouts == 1
    p.forget(later[3])                    # gone before any verify: the count drains
    assert p._open_scouts == 0 and p.shared.interval == 4   # and no evidence: no change
    p.set_batch(2)
    assert not p.allow_drafts()


def test_a_snapshot_restores_evidence_countdown_and_counters():
    s = SharedAcceptance(scout_every=4)
    s.record(3, 1)
    s.scout()
    state = s.snapshot()
    s.record(3, 3)
    s.scout()
    s.scout_done(False)
    s.restore(state)
    assert (s.successes, s.trials, s._until_scout, s.interval, s.num_benched, s.num_scouts) \
        == (1.0, 2.0, 3, 4, 1, 0)


def test_without_a_pool_every_request_starts_at_the_prior_and_none_is_benched():
    """(the n-gram proposer's policy: its acceptance is each request's own text)"""
    p = DraftLengthPolicy(3, 0.27, prior=0.8)
    first = seq("first")
    for _ in range(10):
        p.record(first, 3, 0)
    new = [seq(f"r{i}") for i in range(9)]
    assert not any(p.benched(s) for s in new) and p.acceptance(new[8]) == 0.8
    assert p.pooled() == 0.8 and p.num_drafts(new[0]) == 3


def test_without_evidence_a_request_starts_at_the_prior():
    p = DraftLengthPolicy(3, 0.27, prior=0.8, shared=SharedAcceptance())
    s = seq("a")
    assert p.pooled() == 0.8 and p.acceptance(s) == 0.8 and not p.benched(s)


def test_benched_and_scout_requests_are_counted_on_metrics():
    from mtpserve.server.spec_metrics import SpecDecodeCollector
    from mtpserve.spec.metrics import SpecMetrics

    m = SpecMetrics(3)
    m.record(3, 1)
    assert (m.num_benched_requests, m.num_scout_requests) == (0, 0)   # no pool: none
    m.pool = SharedAcceptance(scout_every=4)
    for _ in range(9):
        m.pool.scout()
    samples = {s.name: s.value for fam in SpecDecodeCollector(lambda: {"spec": m}).collect()
               for s in fam.samples}
    p = "mtpserve:spec_decode_"
    assert samples[p + "num_benched_requests_total"] == 7
    assert samples[p + "num_scout_requests_total"] == 2
    assert samples[p + "num_verify_steps_total"] == 1


@pytest.mark.parametrize("algo, kw, pooled", [
    ("ngram", {}, False),
    ("draft", dict(speculative_draft_model_path="self"), True),
], ids=["ngram", "draft"])
def test_model_drafters_pool_and_the_ngram_proposer_does_not(algo, kw, pooled):
    """(the MTP's: test_mtp_overlap.py) A draft model's acceptance is mostly the pair of
    models'; an n-gram proposer's is each request's own text."""
    from mtpserve import LLM

    llm = LLM(None, dtype="float32", device="cpu", max_model_len=256, num_kv_blocks=64,
              max_num_seqs=2, speculative_algorithm=algo, **kw)
    policy = llm.engine.proposer.policy
    assert isinstance(policy.shared, SharedAcceptance) is pooled
    assert llm.engine.spec_metrics.pool is policy.shared
    if pooled:   # the server's internal warm-up request leaves the pool as it was
        policy.shared.trials = 1e6   # (priced out: the warm-up request is benched)
        llm.engine.warmup()
        assert (policy.shared.num_benched, policy.shared.num_scouts) == (0, 0)
        assert (policy.shared.successes, policy.shared.trials) == (0.0, 1e6)
        assert llm.engine.spec_metrics.num_benched_requests == 0
        # the pool on /metrics is still the policy's (a review found warm-up swapping in a copy)
        assert llm.engine.spec_metrics.pool is policy.shared


def test_warm_up_drafts_within_a_tiny_context():
    """The warm-up's drafting requests (engine.py ``warmup``) ask at most what the context
    holds: 8 drafts per step in a 16-token context made them ask 20 tokens, and the engine never
    became ready (a fresh review's finding). Its verify steps leave no counts behind."""
    from mtpserve import LLM

    llm = LLM(None, dtype="float32", device="cpu", max_model_len=16, num_kv_blocks=64,
              max_num_seqs=2, speculative_algorithm="ngram", speculative_num_steps=8)
    llm.engine.warmup()
    m = llm.engine.spec_metrics
    assert (m.num_draft_tokens, m.num_verify_steps, sum(m.accepted_per_step)) == (0, 0, 0)
    assert not llm.engine.seqs
