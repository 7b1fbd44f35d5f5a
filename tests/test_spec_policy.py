"""The adaptive draft-length policy: drafts only what its acceptance pays for."""

from __future__ import annotations

import pytest

from mtpserve.engine.sequence import Sequence
from mtpserve.sampling_params import SamplingParams
from mtpserve.spec.policy import DraftLengthPolicy


def seq(rid="r"):
    return Sequence(rid, [1, 2, 3], SamplingParams(), (), 100, None, None)


def best_m(a, k, cost):
    """Brute force of argmax E(m) / C(m) (ties to the smaller m)."""
    rates = [(1 - a ** (m + 1)) / (1 - a) / (1 + cost * m) for m in range(k + 1)]
    return max(range(k + 1), key=lambda m: (rates[m], -m))


def test_choice_maximises_tokens_per_cost():
    for a in (0.05, 0.3, 0.5, 0.7, 0.9):
        for cost in (0.0, 0.03, 0.1, 0.5, 1.1):
            p = DraftLengthPolicy(5, cost, prior=a)
            assert p.num_drafts(seq()) == best_m(a, 5, cost), (a, cost)


def test_free_drafts_always_use_k_and_a_draft_as_costly_as_the_target_never_pays():
    assert DraftLengthPolicy(4, 0.0).num_drafts(seq()) == 4
    assert DraftLengthPolicy(4, 1.1, prior=0.95).num_drafts(seq()) == 0


def test_estimate_follows_each_request():
    p = DraftLengthPolicy(4, 0.1)
    good, bad = seq("good"), seq("bad")
    for _ in range(10):
        p.record(good, 4, 4)
        p.record(bad, 4, 0)
    assert p.acceptance(good) > 0.95 and p.acceptance(bad) < 0.05
    assert p.num_drafts(good) == 4 and p.num_drafts(bad) == 0
    p.forget(bad)
    assert p.acceptance(bad) == p.prior


def test_with_a_pool_a_new_request_starts_from_every_requests_evidence():
    from mtpserve.spec.shared_acceptance import SharedAcceptance

    p = DraftLengthPolicy(4, 0.1, shared=SharedAcceptance())
    good, bad = seq("good"), seq("bad")
    for _ in range(10):
        p.record(good, 4, 4)
        p.record(bad, 4, 0)
    p.forget(bad)
    # a new start: the acceptance pooled over both requests' 20 verify steps (decay 0.99 each)
    succ = trials = 0.0
    for _ in range(10):
        succ, trials = 0.99 * succ + 4, 0.99 * trials + 4
        succ, trials = 0.99 * succ, 0.99 * trials + 1
    assert p.acceptance(bad) == pytest.approx((0.6 * 4 + succ) / (4 + trials), rel=1e-12)
    assert not p.benched(bad)


def test_an_idle_request_drifts_back_and_tries_again():
    p = DraftLengthPolicy(3, 0.1)
    s = seq()
    for _ in range(10):
        p.record(s, 3, 0)
    assert p.num_drafts(s) == 0
    tries = 1
    while p.num_drafts(s) == 0:
        tries += 1
        assert tries < 200
    assert p.num_drafts(s) >= 1


def test_the_answer_after_a_step_is_previewed_without_changing_anything():
    """num_drafts_after(seq, m, j) is what num_drafts answers once (m, j) is recorded, for a
    new request, one with evidence, one drafting nothing (m = 0), and one at the edge where the
    answer drops to 0 (its drift must not run early)."""
    for history, m in (([], 3), ([(3, 3)] * 2, 3), ([(3, 1)] * 3, 2), ([(3, 0)] * 3, 0),
                       ([(3, 0)] * 4, 3)):
        for j in range(m + 1):
            p, q = DraftLengthPolicy(3, 0.15), DraftLengthPolicy(3, 0.15)
            a, b = seq("a"), seq("a")
            for mm, jj in history:
                p.record(a, mm, jj)
                q.record(b, mm, jj)
            preview = [p.num_drafts_after(a, m, j) for _ in range(3)]   # no side effects
            assert p.acceptance(a) == q.acceptance(b)
            q.record(b, m, j)
            assert preview == [q.num_drafts(b)] * 3, (history, m, j)
    p = DraftLengthPolicy(3, 0.15)   # the answers really differ with the acceptance
    s = seq()
    p.record(s, 3, 0)
    p.record(s, 3, 0)
    assert p.num_drafts_after(s, 3, 3) > p.num_drafts_after(s, 3, 0)


def test_measured_step_costs_stop_drafting_when_verify_steps_get_expensive():
    """With measured step times: at batch 1 verify steps cost what a decode step costs, so every
    draft pays; at batch 64 a step of 64 x (1 + m) tokens costs ~(1 + m) times more, and even a
    good acceptance estimate does not pay for it."""
    times = {1: 1.0, 2: 1.0, 4: 1.02, 64: 1.5, 128: 3.0, 192: 4.5, 256: 6.0, 320: 7.5}

    def cost(tokens, seqs):
        size = next((s for s in sorted(times) if s >= tokens), None)
        return None if size is None else times[size]

    p = DraftLengthPolicy(3, 0.0, prior=0.7, step_cost=cost)
    s = seq()
    p.set_batch(1)
    assert p.num_drafts(s) == 3
    p.set_batch(64)
    assert p.num_drafts(s) == 0
    p.set_batch(100)  # 100 x (1 + m) tokens cost 2x and more, or were never measured
    assert p.num_drafts(s) == 0


def test_step_timer_learns_host_seconds_per_sequence_and_per_drafting_sequence():
    from mtpserve.engine.step_timer import StepTimer

    t = StepTimer(window=3, min_samples=2)
    t.record(64, 64, 0.005, None)      # no device time known: nothing learned
    t.record(64, 64, 0.005, 0.003)     # plain step: 2 ms of host time over 64 sequences
    assert t.host_per_seq == 0.0       # one sample is not enough
    t.record(4, 4, 0.001, 0.003)       # faster than the device estimate: counts as zero
    assert t.host_per_seq == 0.001 / 64   # median of 2: their mean
    t.record(2, 2, 0.004, 0.003)       # 0.5 ms per sequence
    assert t.host_per_seq == 0.002 / 64   # median of 0.002 / 64, 0, 0.0005
    # steps of 4 sequences with 3 drafts each: what 4 sequences leave over goes to the 4
    t.record(16, 4, 0.004, 0.003)
    assert t.host_per_drafting_seq(3) == 0.0 and not t.drafts_measured
    t.record(16, 4, 0.004, 0.003)
    assert t.drafts_measured
    per = (0.001 - 4 * 0.002 / 64) / 4
    assert t.host_per_drafting_seq(3) == pytest.approx(per)
    assert t.host_seconds(16, 4) == pytest.approx(4 * t.host_per_seq + 4 * per)
    # 2 of the 8 sequences drafted 3 each (m = 3): the leftover is theirs alone
    t.record(14, 8, 0.005, 0.003, num_drafting=2)
    assert t.host_per_drafting_seq(3) == pytest.approx(
        sorted([per, per, (0.002 - 8 * 0.002 / 64) / 2])[1])


def test_step_timer_prices_an_unmeasured_draft_count_from_its_neighbours():
    """Each m keeps its own samples: a drafting step of one draft teaches the cost of one draft
    per sequence, not a price per draft token (H200, hybrid MoE MTP at batch 1: steps of m = 1
    and m = 3 both add ~1 ms, the MTP chain runs whole; priced per draft, m = 1 steps made
    three drafts cost 2.4 ms). An m not measured costs the nearest larger measured m, or above
    them all the largest scaled by m."""
    from mtpserve.engine.step_timer import StepTimer

    t = StepTimer(min_samples=1)
    t.record(2, 1, 2.40e-3, 1.50e-3)   # m = 1: 0.9 ms of drafting host time
    assert [t.host_per_drafting_seq(m) for m in (1, 2, 3)] == pytest.approx(
        [0.9e-3, 1.8e-3, 2.7e-3])   # only m = 1 seen: scaled by m above it
    t.record(4, 1, 2.60e-3, 1.55e-3)   # m = 3: 1.05 ms
    assert [t.host_per_drafting_seq(m) for m in (1, 2, 3, 6)] == pytest.approx(
        [0.9e-3, 1.05e-3, 1.05e-3, 2.1e-3])
    assert t.host_seconds(4, 1) == pytest.approx(1.05e-3)
    assert t.host_seconds(64 * 3, 64) == pytest.approx(64 * 1.05e-3)   # m = 2: from m = 3
    flat = StepTimer(min_samples=1, drafting_scales=False)   # an MTP chain runs whole
    flat.record(2, 1, 2.40e-3, 1.50e-3)
    assert [flat.host_per_drafting_seq(m) for m in (1, 2, 3)] == pytest.approx([0.9e-3] * 3)


def test_one_slow_first_drafting_step_does_not_price_drafts_out():
    """The first steps with drafts of a fresh engine may compile kernels or build cuDNN plans
    (50-150 ms on the H200 at batch 1): a median of the recent steps, from 3 on, keeps such a
    step from pricing every later draft out (before, the first step's time stuck, since no
    later step drafted)."""
    from mtpserve.engine.step_timer import StepTimer

    t = StepTimer()
    for wall in (0.190, 0.0027, 0.0026):   # 1 + 3 tokens, 1.73 ms on the device
        assert t.host_per_drafting_seq(3) == 0.0
        t.record(4, 1, wall, 0.00173)
    assert t.host_per_drafting_seq(3) == pytest.approx(0.0027 - 0.00173)
    for wall in (0.5, 0.6, 0.7, 0.8):   # slow steps win only once they are the majority
        t.record(4, 1, wall, 0.00173)
    assert t.host_per_drafting_seq(3) == pytest.approx(0.5 - 0.00173)


def test_a_drafting_time_is_forgotten_max_age_seconds_after_its_last_sample():
    """Each m's drafting time is dropped ``max_age`` seconds after its last sample (plain steps
    do not refresh it); the m is then priced from the others, or as unmeasured."""
    from mtpserve.engine.step_timer import StepTimer

    now = [0.0]
    t = StepTimer(min_samples=1, max_age=30.0, clock=lambda: now[0])
    t.record(4, 1, 10.0e-3, 1.73e-3)     # m = 3 at t = 0: 8.27 ms of drafting host time
    now[0] = 20.0
    t.record(2, 1, 2.23e-3, 1.50e-3)     # m = 1 at t = 20: 0.73 ms
    t.record(1, 1, 1.30e-3, 1.26e-3)     # a plain step: refreshes nothing
    now[0] = 29.9
    assert t.host_per_drafting_seq(3) == pytest.approx(8.27e-3)
    now[0] = 30.1                        # m = 3 forgotten: priced from m = 1, scaled by m
    assert t.host_per_drafting_seq(3) == pytest.approx(3 * 0.73e-3)
    assert t.drafts_measured
    now[0] = 50.1                        # m = 1 too: nothing measured
    assert t.host_per_drafting_seq(3) == 0.0 and not t.drafts_measured
    assert t.host_per_seq == pytest.approx(0.04e-3)   # the per-sequence time stays
    for _ in range(3):                   # three slow samples of m = 3 at t = 60 ...
        now[0] = 60.0
        t.record(4, 1, 10.0e-3, 1.73e-3)
    now[0] = 100.0                       # ... then, with no read between, one fast one
    t.record(4, 1, 2.23e-3, 1.73e-3)
    assert t.host_per_drafting_seq(3) == pytest.approx(0.46e-3)   # alone, not their median


def test_a_drafting_time_learned_in_a_slow_spell_does_not_stop_drafting_for_good():
    """A drafting time learned while the host was slow prices drafts out, and where nothing
    drafts it is never sampled again (with the load gate seeing drafting win, nothing probes
    it: speculation stayed off for good, a review's finding with the step timer in
    benchmarks/cpu_policy_sim.py). Once forgotten, the request drafts again."""
    from mtpserve.engine.step_timer import StepTimer

    now = [0.0]
    timer = StepTimer(min_samples=1, max_age=30.0, clock=lambda: now[0],
                      drafting_scales=False)
    for m in (1, 2, 3):   # 6 ms of drafting host time on top of a 1.26 ms step
        timer.record(1 + m, 1, 1.26e-3 * (1 + 0.1 * m) + 6e-3, 1.26e-3 * (1 + 0.1 * m))

    def cost(tokens, seqs):
        return 1.26e-3 * tokens / seqs * 0.1 + 1.26e-3 * 0.9 + timer.host_seconds(tokens, seqs)

    p = DraftLengthPolicy(3, 0.1, prior=0.9, step_cost=cost, draft_cost=0.07,
                          drafts_measured=lambda: timer.drafts_measured)
    s = seq()
    p.set_batch(1)
    assert p.num_drafts(s) == 0
    now[0] = 31.0
    p.set_batch(1)
    assert p.num_drafts(s) == 3


def test_the_first_drafting_step_after_plain_steps_is_not_a_price_per_draft():
    """A drafting step right after plain steps first catches the proposer up and drafts from
    scratch (H200, hybrid MoE MTP at batch 1: 5.3-5.8 ms, against ~2.7 ms for a drafting step
    that follows another and 1.26 ms for a plain step): the timer learns the drafting time
    from drafting steps that follow drafting steps only."""
    from mtpserve.engine.step_timer import StepTimer

    t = StepTimer(min_samples=1)
    t.record(4, 1, 5.5e-3, 1.73e-3, after_plain=True)    # the switch: not learned
    assert t.host_per_drafting_seq(3) == 0.0 and not t.drafts_measured
    t.record(4, 1, 2.66e-3, 1.73e-3, after_plain=False)  # drafting after drafting
    assert t.drafts_measured
    assert t.host_per_drafting_seq(3) == pytest.approx(0.93e-3)
    t.record(1, 1, 1.5e-3, 1.26e-3, after_plain=True)    # plain steps learn either way
    assert t.host_per_seq == pytest.approx(0.24e-3)


def _drive_gate(g, n: int, steps: int, draft, plain) -> list[bool]:
    """Drive the load gate ``g`` as the engine does for ``steps`` decode steps of ``n``
    sequences: ask ``allow``, then record the step under that decision, a step it lets draft
    right after one it vetoed being a switch. ``draft(switch)`` / ``plain()``: the step's
    (tokens, seconds). Returns the decisions."""
    decisions = []
    for _ in range(steps):
        drafting = g.allow(n)
        switch = drafting and not (decisions[-1] if decisions else False)
        tokens, seconds = draft(switch) if drafting else plain()
        g.record(n, drafting, tokens=tokens, seconds=seconds, switch=switch)
        decisions.append(drafting)
    return decisions


def test_load_gate_vetoes_drafting_where_plain_steps_are_faster():
    """Nothing measured: a drafting probe of 4 steps (the first a switch, not recorded; the
    figure is the other three's tokens over their seconds), then a plain step. Plain steps are
    faster, so the gate vetoes until the next probe; the probe loses and the interval doubles;
    once drafting is faster a probe lifts the veto and plain steps are probed instead."""
    from mtpserve.spec.load_gate import LoadGate

    g = LoadGate(probe_every=8, probe_budget=1.0)   # the probe budget never binds here

    def slow(switch):   # 12000 tok/s drafting, 3200 for a switch
        return (64, 0.020) if switch else (120, 0.010)

    def plain():        # 16000 tok/s
        return 64, 0.004

    assert _drive_gate(g, 64, 5, slow, plain) == [True] * 4 + [False]
    assert g.rates(64) == (12000.0, 16000.0)
    # the next probe of drafting 8 steps after the plain one (step 13): it loses again, so the
    # one after comes 16 steps after it (step 29)
    assert _drive_gate(g, 64, 24, slow, plain) == [False] * 7 + [True] * 4 + [False] * 12 + [True]
    assert g.rates(64) == (12000.0, 16000.0)
    # another bucket is measured on its own: one sequence still explores
    assert [g.bucket(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]
    assert g.bucket(33) == g.bucket(64) != g.bucket(32)
    assert g.allow(1) is True
    # drafting becomes faster: the rest of the probe (steps 30-32) replaces the figure, drafting
    # is chosen, and plain is probed 8 steps after the probe (step 37, a win for drafting: the
    # next 16 steps later), the drafting step after it a switch again
    fast = lambda switch: (400, 0.010)   # noqa: E731  (40000 tok/s)
    assert _drive_gate(g, 64, 25, fast, plain) == [True] * 7 + [False] + [True] * 15 + [False, True]
    assert g.rates(64) == (40000.0, 16000.0)
    with pytest.raises(ValueError, match="probe_every"):
        LoadGate(probe_every=1)
    with pytest.raises(ValueError, match="probe_steps"):
        LoadGate(probe_steps=1)
    with pytest.raises(ValueError, match="probe_every"):   # a drafting probe fills the interval
        LoadGate(probe_every=6, probe_steps=4)


def test_a_probe_replaces_its_arms_stale_figure():
    """Drafting lost while a request accepted nothing (300 vs 500 tok/s); a new request that accepts
    everything is probed at 1500 tok/s: the probe's figure replaces the old one (blended at 0.1 a
    step it would be 325 after the probe's steps and the veto would hold for further probes), so
    drafting resumes at once. A plain step recorded during the probe (under async scheduling, the
    plain step that the probe's switch drained) is blended as usual and leaves the probe to the
    drafting steps. A drafting step after the probe is blended by its tokens and seconds (ratio of
    the means: 1354 tok/s here, where a mean of the rates would say 1380)."""
    from mtpserve.spec.load_gate import LoadGate

    g = LoadGate(probe_every=8, probe_budget=1.0)   # the probe budget never binds here
    _drive_gate(g, 1, 40, lambda switch: (1, 1 / 300), lambda: (1, 1 / 500))
    assert g.rates(1) == pytest.approx((300.0, 500.0))
    while not g.allow(1):                 # plain until the next probe
        g.record(1, False, tokens=1, seconds=1 / 500)
    g.record(1, False, tokens=1, seconds=1 / 600)               # drained by the switch
    g.record(1, True, tokens=4, seconds=4 / 600, switch=True)   # the probe's switch: skipped
    assert g.rates(1)[0] == pytest.approx(300.0)
    assert g.rates(1)[1] == pytest.approx(1 / (0.9 / 500 + 0.1 / 600))
    for _ in range(3):                    # the probe's other steps
        assert g.allow(1) is True
        g.record(1, True, tokens=4, seconds=4 / 1500)
    assert g.rates(1)[0] == pytest.approx(1500.0)
    assert g.allow(1) is True             # drafting chosen at once
    g.record(1, True, tokens=1, seconds=1 / 300)    # not a probe: blended by tokens and seconds
    assert g.rates(1)[0] == pytest.approx((0.9 * 4 + 0.1) / (0.9 * 4 / 1500 + 0.1 / 300))


def test_probes_that_confirm_the_veto_come_ever_less_often():
    """A probe of drafting (here two steps: the first, a switch after plain steps, is not
    recorded) that loses again doubles the interval to the next probe (8, 16, then capped at
    16); one that wins brings it back to ``probe_every`` (and drafting on). On the H200 a probe
    at 64 requests whose drafts were all rejected cost 20 ms, 4.6 plain steps."""
    from mtpserve.spec.load_gate import LoadGate

    g = LoadGate(probe_every=4, max_probe_every=16, probe_budget=1.0, probe_steps=2)
    tps = 300.0
    decisions = _drive_gate(g, 1, 62, lambda switch: (1, 1 / tps), lambda: (1, 1 / 700))
    # steps 1-3 explore (drafting twice, then plain); every probe loses again
    assert [i + 1 for i, d in enumerate(decisions) if d] == [1, 2, 7, 8, 15, 16, 31, 32, 47, 48]
    tps = 1500.0   # the next probe (63-64) wins: drafting on, plain probed 4 steps after it
    decisions = _drive_gate(g, 1, 8, lambda switch: (1, 1 / tps), lambda: (1, 1 / 700))
    assert decisions == [True] * 4 + [False] + [True] * 3


def test_a_probe_whose_last_step_is_not_recorded_is_closed_on_what_it_heard():
    """A drafting probe's last step may never reach the gate (a prefill chunk in it, no tokens,
    a batch of another bucket's size). The next step closes the probe and backs off on the
    steps it did hear: a lost probe spaces the next by its cost, as a whole probe would, and
    the cost is not carried into the probe after (a review: the probe stayed open, the
    interval stayed at 32 and the cost grew)."""
    from mtpserve.spec.load_gate import LoadGate

    def lost_probe(record_last: bool):
        g = LoadGate(probe_every=16)
        g.record(1, True, tokens=1, seconds=1 / 200)
        g.record(1, False, tokens=1, seconds=1 / 500)   # measured: drafting loses
        assert [g.allow(1) for _ in range(16)] == [False] * 15 + [True]   # probe at 16
        g.record(1, True, tokens=1, seconds=1 / 200, switch=True)
        for i in range(3):
            assert g.allow(1) is True
            if i < 2 or record_last:
                g.record(1, True, tokens=1, seconds=1 / 200)
        b = g._buckets[0]
        steps = 19
        while not g.allow(1):
            steps += 1
        return steps + 1 - 16, b

    whole, _ = lost_probe(True)
    cut, b = lost_probe(False)
    # lost 4 x (1/200 - 1/500) s against a 1/500 s plain step: 200 steps at the 3% budget
    # whole; the cut probe's 3 recorded steps, switch included, cost 150
    assert (whole, cut) == (200, 150)
    assert b.probe is True and b.probe_loss == 0.0 and b.probe_n == 0   # the new probe


def test_exploring_alternates_drafting_and_plain_probes():
    """Until both arms are measured, drafting probes and plain steps take turns, also when no
    drafting step is ever recorded (every one carried a prefill chunk): the bucket does not
    draft on every step, and plain gets measured."""
    from mtpserve.spec.load_gate import LoadGate

    g = LoadGate(probe_every=16)
    assert [g.allow(1) for _ in range(10)] == [True] * 4 + [False] + [True] * 4 + [False]
    g.record(1, False, tokens=1, seconds=1 / 500)
    assert g.rates(1) == (None, pytest.approx(500.0))


def test_a_lost_drafting_probe_is_spaced_by_what_it_cost():
    """Past the doubling cap, a drafting probe that lost comes back only once its cost is within
    3% of the plain decoding time in between. H200 figures, every draft rejected: at batch 1 the
    switch costs 5.5 ms and the next drafting step 2.6 ms, 1 token each, against 1.26 ms plain
    steps (5.58 ms lost: 148 steps); at 64 requests the switch, with the MTP catching up, ~60
    ms and the next 17 ms, 64 tokens each, against 4.4 ms plain steps (68 ms lost: 517 steps)."""
    from mtpserve.spec.load_gate import LoadGate

    def interval_after_lost_probe(n: int, plain_s: float, switch_s: float, next_s: float):
        g = LoadGate(probe_every=16, probe_steps=2)   # intervals double up to 64, the budget's
        # up to 1024
        g.record(n, True, tokens=n, seconds=next_s)
        g.record(n, False, tokens=n, seconds=plain_s)     # both arms measured: drafting loses
        allowed = [g.allow(n) for _ in range(17)]
        assert allowed == [False] * 15 + [True, True]   # the probe at step 16, two steps
        g.record(n, True, tokens=n, seconds=switch_s, switch=True)
        g.record(n, True, tokens=n, seconds=next_s)      # lost again
        steps = 17
        while not g.allow(n):
            g.record(n, False, tokens=n, seconds=plain_s)
            steps += 1
        return steps + 1 - 16   # from the probe's step to the next probe

    assert interval_after_lost_probe(1, 1.26e-3, 5.5e-3, 2.6e-3) == 148
    assert interval_after_lost_probe(64, 4.4e-3, 60e-3, 17e-3) == 517
    assert interval_after_lost_probe(64, 4.4e-3, 400e-3, 17e-3) == 1024   # at most 64 x 16
    # a cheap lost probe keeps the doubling: 16 -> 32 steps
    assert interval_after_lost_probe(1, 1.26e-3, 1.3e-3, 1.3e-3) == 32
    with pytest.raises(ValueError, match="probe_budget"):
        LoadGate(probe_budget=0)


def test_a_new_larger_bucket_inherits_a_veto_instead_of_exploring():
    """Drafting lost at 16 sequences: the bucket of 64 starts vetoed (no drafting step to
    explore it), its first plain step replaces the inherited plain figure, and it probes
    drafting after ``probe_every`` steps. Smaller buckets, and buckets whose nearest measured
    smaller bucket had drafting win, explore as before."""
    from mtpserve.spec.load_gate import LoadGate

    g = LoadGate(probe_every=4, probe_steps=2)
    g.allow(16)
    g.record(16, True, tokens=16, seconds=0.010)    # 1600 tok/s drafting
    g.allow(16)
    g.record(16, False, tokens=16, seconds=0.004)   # 4000 tok/s plain
    assert [g.allow(64) for _ in range(4)] == [False, False, False, True]
    assert g.rates(64) == (1600.0, 4000.0)
    g.record(64, False, tokens=64, seconds=0.008)   # its own first plain step: 8000 tok/s
    assert g.rates(64) == (1600.0, 8000.0)
    assert g.allow(1) is True and g.allow(8) is True  # smaller buckets explore
    g2 = LoadGate(probe_every=4, probe_steps=2)
    g2.record(1, True, tokens=1, seconds=1 / 300)
    g2.record(1, False, tokens=1, seconds=1 / 700)  # drafting loses at 1 sequence,
    g2.record(8, True, tokens=20, seconds=0.002)
    g2.record(8, False, tokens=8, seconds=0.002)    # but wins at 8: the nearest measured
    assert g2.allow(32) is True                       # bucket below 17-32, which explores
    assert g2.rates(32) == (None, None)


def test_proposer_drafts_nothing_when_the_gate_vetoes():
    from mtpserve.spec.load_gate import LoadGate
    from mtpserve.spec.ngram import NgramProposer

    gate = LoadGate(probe_every=1000)
    gate.record(1, True, tokens=10, seconds=1.0)
    gate.record(1, False, tokens=20, seconds=1.0)
    prop = NgramProposer(3, 1, 3, DraftLengthPolicy(3, 0.0, prior=0.9, gate=gate))
    s = Sequence("r", [5, 6, 7, 5, 6, 7, 5, 6], SamplingParams(), (), 100, None, None)
    # an obvious repeat: n-gram drafts 7, 5, 6
    prop.propose([s])
    assert s.draft_token_ids == []
    gate.record(1, True, tokens=100, seconds=1.0)
    gate.record(1, True, tokens=100, seconds=1.0)
    prop.propose([s])
    assert s.draft_token_ids == [7, 5, 6]


def _h200_like_policy(timer, gate=None, prior=0.6):
    """A policy priced as the hybrid MoE's MTP engine on the H200: graph replays of 1..4 tokens
    1.26 / 1.45 / 1.60 / 1.73 ms, host time from ``timer``, 0.2 decode steps per draft in the
    model (alpha 0.03 + 2 / 12 layers)."""
    device = {1: 1.26e-3, 2: 1.45e-3, 3: 1.60e-3, 4: 1.73e-3}
    return DraftLengthPolicy(3, 0.2, prior=prior, draft_cost=0.17, gate=gate,
                             step_cost=lambda n, b: device[n] + timer.host_seconds(n, b),
                             drafts_measured=lambda: timer.drafts_measured)


def test_measured_drafting_steps_are_not_charged_the_proposer_twice():
    """The step timer times whole steps, the proposer's drafting included: once it has measured
    steps with drafts, the policy stops adding its modelled cost per draft on top."""
    from mtpserve.engine.step_timer import StepTimer

    timer = StepTimer(min_samples=1)
    p = _h200_like_policy(timer)
    p.set_batch(1)
    assert p._relative_cost(3) == pytest.approx(1.73 / 1.26 + 3 * 0.17)   # nothing measured
    timer.record(4, 1, 2.66e-3, 1.73e-3)   # a whole 1 + 3 step: 0.93 ms beside the forward
    p.set_batch(1)
    assert p._relative_cost(3) == pytest.approx(2.66 / 1.26)


def test_steps_of_one_draft_do_not_price_out_a_request_accepting_two_of_three():
    """H200 session 12, the hybrid MoE's MTP engine at batch 1: steps that verified one draft
    (wall ~2.4 ms) taught 0.80 ms *per draft*, so three drafts cost 2.4 ms of host time and a
    request accepting 2 of 3 (1.44x when it drafts) was priced out: 0.99x. Per drafting
    sequence, the same steps teach what a step of three drafts costs: the request drafts 3."""
    from mtpserve.engine.step_timer import StepTimer

    timer = StepTimer(min_samples=1, drafting_scales=False)   # as spec/__init__.py sets MTP's
    for _ in range(3):
        timer.record(2, 1, 2.43e-3, 1.45e-3)   # m = 1 steps: 0.98 ms beside the forward
    p = _h200_like_policy(timer, prior=2 / 3)
    s = seq()
    p.set_batch(1)
    assert p._relative_cost(3) == pytest.approx((1.73 + 0.98) / 1.26)
    assert p.num_drafts(s) == 3   # E(3) = 2.41 tokens for 2.15 steps' time


def test_a_probe_of_the_drafting_arm_prices_drafts_by_the_model():
    """Measured costs that price every draft out would keep every request from drafting, hence
    from measuring again. On the gate's probe of the drafting arm (and before it has measured
    drafting), the policy prices by its model: the request drafts, and the step is measured."""
    from mtpserve.engine.step_timer import StepTimer
    from mtpserve.spec.load_gate import LoadGate

    timer = StepTimer(min_samples=1)
    timer.record(4, 1, 0.2, 1.73e-3)   # one stalled drafting step: ~66 ms per draft
    gate = LoadGate(probe_every=4, probe_steps=2)
    p = _h200_like_policy(timer, gate, prior=0.8)
    s = seq()
    answers = []
    for drafted, tps, switch in ((True, 10.0, True), (True, 10.0, False), (False, 800.0, False),
                                 (None, 0, False), (None, 0, False), (None, 0, False),
                                 (None, 0, False), (None, 0, False)):
        p.set_batch(1)
        allowed = p.allow_drafts()
        answers.append((allowed, gate.exploring(1) if allowed else None,
                        p.num_drafts(s) if allowed else 0))
        if drafted is not None:   # steps 1-3 explore: drafting (a switch, then measured), plain
            gate.record(1, drafted, tokens=1, seconds=1 / tps, switch=switch)
    # drafting not measured yet: explore (priced by the model); plain is chosen (800 vs 10
    # tok/s); 4 steps after the plain one, a probe of drafting (2 steps), priced by the model
    assert answers == [(True, True, 3)] * 2 + [(False, None, 0)] * 4 + [(True, True, 3)] * 2
    p.set_batch(1)   # measured prices alone: the stalled step prices every draft out
    p._costs = None
    assert p._best(0.8) == 0
