"""Plain steps of an MTP engine under async scheduling (engine/overlap.py): when nothing drafts
(the load gate vetoes, or the policy gives every sequence 0 drafts) the step is launched before
the previous one is read back, and the MTP observes it on the device (spec/mtp.py
``observe_launched``, the ids after each token from overlap.py ``next_token_ids``).

On the tiny trained hybrid (drafts get accepted): the same drafts, step by step, as the
synchronous engine with the same gate, plain decoding's tokens, with chunked prefill and under
preemption; and the id pairing itself on hand-made batches."""

from __future__ import annotations

import pytest
import torch

from harness_hybrid import one_thread_module  # noqa: F401 (a fixture)
from mtpserve import LLM, SamplingParams
from mtpserve.engine.overlap import PendingStep, next_token_ids
from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from mtpserve.engine.sequence import Sequence
from mtpserve.spec.shared_acceptance import SharedAcceptance
from test_async_scheduling import ScriptedGate
from test_draft_ahead import KW, K
from trained_hybrid import held_out_prompts, trained_hybrid_dir

pytestmark = pytest.mark.usefixtures("one_thread_module")


def _seq(rid: str, tokens: list[int], computed: int, pending: int = 0) -> Sequence:
    seq = Sequence(rid, tokens, SamplingParams(), (), 64, None, None)
    for _ in range(pending):
        seq.add_placeholder()
    seq.num_computed_tokens = computed
    return seq


class _Batch:
    def __init__(self, ids):
        self.input_ids = torch.tensor(ids)

    @property
    def num_tokens(self):
        return self.input_ids.shape[0]


def test_next_token_ids_pair_each_token_with_the_one_after_it():
    # a decode row (its newest token pending from the last step, 41 on the device), a
    # prefill chunk of 3 that does not end its prompt, the final chunk of another prompt
    a = _seq("a", [1, 2], computed=2, pending=1)                # decodes position 2
    b = _seq("b", [10, 11, 12, 13, 14, 15], computed=0)         # chunk 0..2, next is 13
    c = _seq("c", [20, 21, 22], computed=1)                    # chunk 1..2, samples
    sched = SchedulerOutput([ScheduledSeq(a, 1, []), ScheduledSeq(b, 3, []),
                             ScheduledSeq(c, 2, [])])
    assert [s.samples for s in sched.scheduled] == [True, False, True]
    for s in sched.scheduled:                                   # as the engine has done
        s.seq.num_computed_tokens += s.num_new_tokens
    batch = _Batch([41, 10, 11, 12, 21, 22])
    sampled = torch.tensor([50, 60])                            # a's and c's tokens
    prev = PendingStep(SchedulerOutput(), [], torch.tensor([41]), None, None, {"a": 0})
    ids = next_token_ids(batch, sched, sampled, prev)
    assert ids.tolist() == [50, 11, 12, 13, 22, 60]
    # every row decodes one token: the sampled ids themselves
    e = _seq("e", [30, 31], computed=1)
    one = SchedulerOutput([ScheduledSeq(e, 1, [])])
    e.num_computed_tokens = 2
    assert next_token_ids(_Batch([31]), one, sampled[1:], None).data_ptr() \
        == sampled[1:].data_ptr()


def test_next_token_ids_take_a_pending_token_after_a_prefill_chunk():
    # recompute after preemption: the chunk ends right before the newest token, a placeholder
    # the previous step samples (row 1 of it)
    d = _seq("d", [5, 6, 7], computed=0, pending=1)             # tokens 5 6 7 <pending>
    sched = SchedulerOutput([ScheduledSeq(d, 3, [])])
    assert not sched.scheduled[0].samples
    d.num_computed_tokens = 3
    prev = PendingStep(SchedulerOutput(), [], torch.tensor([90, 91]), None, None,
                       {"x": 0, "d": 1})
    ids = next_token_ids(_Batch([5, 6, 7]), sched, torch.empty(0, dtype=torch.int64), prev)
    assert ids.tolist() == [6, 7, 91]
    with pytest.raises(RuntimeError, match="request d: placeholder without a pending token"):
        next_token_ids(_Batch([5, 6, 7]), sched, torch.empty(0, dtype=torch.int64), None)


class TokenCountGate(ScriptedGate):
    """Allows drafting when the tokens of the running sequences that go on (placeholders
    included; not those that end on a pending token) add up to a multiple of ``every``: the
    same steps draft with and without async scheduling, whose extra calls (the read-back of
    a step whose sequences all end) would shift a pattern counted in calls."""

    def __init__(self, eng, every: int):
        super().__init__(None)
        self.eng, self.every = eng, every

    def allow(self, num_seqs):
        self.calls += 1
        return sum(s.num_tokens for s in self.eng.scheduler.running
                   if not s.finishes_by_length) % self.every == 0


def engine(async_scheduling: bool, pattern=None, path=None, **kw):
    """An MTP engine (``path``, default the tiny trained hybrid) whose load gate follows
    ``pattern`` (None: a TokenCountGate of 3); logs each draft call's drafts and counts the
    steps launched overlapped and the observes of launched steps."""
    llm = LLM(str(path or trained_hybrid_dir()), speculative_algorithm="nextn",
              speculative_num_steps=K, **{**KW, **kw})
    eng, p = llm.engine, llm.engine.proposer
    eng.async_scheduling = async_scheduling
    p.policy.gate = ScriptedGate(list(pattern)) if pattern else TokenCountGate(eng, 3)
    log, counts = [], {"overlapped": 0, "observed": 0, "forwards": 0}
    draft, overlapped, observed = p.draft, eng._overlapped_step, p.observe_launched
    forward = p._observe_forward

    def counted_forward(*a, **k):
        counts["forwards"] += 1
        return forward(*a, **k)

    p._observe_forward = counted_forward

    def logged(work):
        draft(work)
        pend = p.pending
        log.append([(s.request_id, pend.drafts[pend.rows[s.request_id]].tolist()
                     [:len(s.draft_token_ids)] if pend and s.request_id in pend.rows
                     else list(s.draft_token_ids)) for s, _ in work])

    def overlapped_step(*a):   # counts the calls that launched a step (some only read back)
        before = eng._pending
        out = overlapped(*a)
        counts["overlapped"] += eng._pending is not None and eng._pending is not before
        return out

    def observe_launched(*a):
        counts["observed"] += 1
        return observed(*a)

    p.draft, p.observe_launched = logged, observe_launched
    eng._overlapped_step = overlapped_step
    return llm, log, counts


def _generate(llm, prompts, params):
    return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]


CASES = {"default": {}, "chunked-prefill": dict(max_num_batched_tokens=5),
         "preemption": dict(max_model_len=32, num_kv_blocks=10), "backlog-of-2-steps": {}}


@pytest.mark.parametrize("case", list(CASES))
def test_plain_steps_overlap_and_drafts_stay_those_of_the_sync_engine(case):
    """Plain steps overlap and the MTP observes them from its backlog (spec/mtp_backlog.py),
    in one forward per run of plain steps (or every 2 steps when the backlog holds 2): the
    drafts are those of the synchronous engine, which observes every step as it runs."""
    kw = CASES[case]
    prompts = held_out_prompts(5, 6)
    n = 26 if case == "preemption" else 16
    params = [SamplingParams(max_tokens=n - i, temperature=0.0, ignore_eos=True)
              for i in range(5)]
    want = _generate(LLM(str(trained_hybrid_dir()), **{**KW, **kw}), prompts, params)
    runs = {}
    for overlap in (True, False):
        llm, log, counts = engine(overlap, **kw)
        if case == "backlog-of-2-steps":
            llm.engine.proposer.backlog.max_steps = 2
        ids = _generate(llm, prompts, params)
        m = llm.engine.spec_metrics
        runs[overlap] = (ids, log, counts, m.num_accepted_tokens, llm.engine)
    (ids, log, counts, accepted, eng), (ids0, log0, counts0, accepted0, _) = \
        runs[True], runs[False]
    assert ids == want and ids0 == want
    assert log == log0 and accepted == accepted0 > 0 and len(log) >= 3
    assert counts0["overlapped"] == counts0["observed"] == 0
    assert counts["overlapped"] >= 6 and counts["observed"] == counts["overlapped"]
    # the sync engine runs the MTP after every step; the async one once per backlog
    assert counts["forwards"] < counts0["forwards"]
    if case == "preemption":
        assert eng.scheduler.num_preemptions > 0
    assert not eng.proposer.states and eng.proposer.bm.num_free_blocks == eng.runner.num_blocks


def test_policy_that_drafts_nothing_lets_every_step_overlap():
    """The gate allows drafting, but the policy gives every sequence 0 drafts (an acceptance
    prior of 0: nothing pays): every step overlaps, the MTP still observes each one, and
    once the policy expects acceptance again the drafts are those the MTP would make."""
    prompts = held_out_prompts(3, 6)
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    want = _generate(LLM(str(trained_hybrid_dir()), **KW), prompts, params)
    llm, log, counts = engine(True, (True,))
    policy = llm.engine.proposer.policy
    policy.prior = 0.0
    assert _generate(llm, prompts, params) == want
    assert log == [] and counts["overlapped"] >= 13 and counts["observed"] == counts["overlapped"]
    # no MTP forward at all; the backlog went with the last request
    assert counts["forwards"] == 0 and len(llm.engine.proposer.backlog) == 0
    # the same engine, drafting again: equal to a sync engine's drafts
    policy.prior = 0.9
    got = _generate(llm, prompts, params)
    sync, log0, _ = engine(False, (True,))
    sync.engine.proposer.policy.prior = 0.9
    assert got == want and _generate(sync, prompts, params) == want
    drafts = [[d for _, d in call] for call in log]   # request ids differ: gen-3.. / gen-0..
    assert drafts == [[d for _, d in call] for call in log0] and len(log) >= 3


@pytest.mark.parametrize("overlap", [True, False])
def test_benched_requests_are_never_observed_and_scouts_still_draft(overlap):
    """While the acceptance pooled over earlier requests prices drafting out, new requests are
    benched (spec/shared_acceptance.py): the MTP keeps no state for them and runs no forward
    over their positions. With a scout every 2nd request, only the scouts get MTP states and
    drafts (accepted ones: the trained MTP). Tokens equal plain decoding in both."""
    prompts = held_out_prompts(4, 6)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    want = _generate(LLM(str(trained_hybrid_dir()), **KW), prompts, params)
    llm, log, counts = engine(overlap, (True,))   # the gate always allows drafting
    p = llm.engine.proposer
    assert isinstance(p.policy.shared, SharedAcceptance)   # the MTP's policy pools
    assert llm.engine.spec_metrics.pool is p.policy.shared
    p.policy.shared = SharedAcceptance(scout_every=10 ** 9)
    p.policy.shared.trials = 1e6                 # pooled acceptance ~0: every start priced out
    made, state = [], p._state
    p._state = lambda seq: (made.append(seq.request_id), state(seq))[1]
    assert _generate(llm, prompts, params) == want
    assert log == [] and made == [] and counts["forwards"] == 0 and not p.states
    assert llm.engine.spec_metrics.num_draft_tokens == 0
    p.policy.shared = SharedAcceptance(scout_every=2)
    p.policy.shared.trials = 1e6
    assert _generate(llm, prompts, params) == want
    scouts = sorted(set(made))
    assert len(scouts) == 2 and not p.states
    assert {rid for call in log for rid, _ in call} == set(scouts)
    assert llm.engine.spec_metrics.num_accepted_tokens > 0


def test_penalties_keep_mtp_steps_synchronous():
    """A request that reads its output so far (a repetition penalty) keeps every step
    synchronous, even when nothing drafts."""
    llm, log, counts = engine(True, (False,))
    params = SamplingParams(max_tokens=6, temperature=0.0, repetition_penalty=1.2)
    out = _generate(llm, held_out_prompts(1, 6), params)
    assert len(out[0]) == 6 and counts["overlapped"] == counts["observed"] == 0


def test_backlog_keeps_each_sequences_latest_run_of_positions():
    """ObserveBacklog.take: per running sequence its consecutive positions across steps, rows
    in backlog order; a sequence recomputed from 0 after preemption starts a new run; a
    finished one is left out; the backlog is full at its step or token limit."""
    from mtpserve.spec.mtp_backlog import ObserveBacklog

    a = _seq("a", [1, 2, 3, 4, 5, 6], computed=3)
    b = _seq("b", [7, 8, 9], computed=0)
    c = _seq("c", [4, 4], computed=1)
    log = ObserveBacklog(max_tokens=9, max_steps=3)

    def step(*chunks):   # (seq, tokens) per scheduled sequence
        sched = SchedulerOutput([ScheduledSeq(s, n, []) for s, n in chunks])
        for s, n in chunks:
            s.num_computed_tokens += n
        T = sum(n for _, n in chunks)
        hidden = torch.arange(float(log.num_tokens), float(log.num_tokens + T)).unsqueeze(1)
        log.add(sched, hidden, hidden[:, 0].long() + 100)

    step((a, 1), (b, 2), (c, 1))          # a: 3, b: 0-1, c: 1      rows 0 | 1 2 | 3
    assert not log.full
    a.num_computed_tokens = 0             # a preempted: recomputed from 0
    step((b, 1), (a, 2))                  # b: 2, a: 0-1            rows 4 | 5 6
    c.finish("abort")
    step((a, 1))                          # a: 2                    row 7
    assert log.full and len(log) == 3 and log.num_tokens == 8
    runs, hidden, ids = log.take()
    assert [(r.seq.request_id, r.start, r.rows) for r in runs] == [("a", 0, [5, 6, 7]),
                                                                  ("b", 0, [1, 2, 4])]
    assert hidden.flatten().tolist() == list(range(8)) and ids.tolist()[:2] == [100, 101]
    assert len(log) == 0 and log.num_tokens == 0 and log.take() == ([], None, None)


def test_a_synchronous_step_observes_the_backlog_first():
    """Overlapped plain steps, then synchronous ones that draft nothing (a request with a
    repetition penalty arrives: every step drains), then drafting: the MTP catches up on the
    backlog before it observes the first synchronous step, so the greedy sequences keep sound
    MTP states and draft (accepted on the trained model) once the gate opens."""
    llm, log, counts = engine(True, (False,))
    eng, prompts = llm.engine, held_out_prompts(3, 6)
    gate, p = eng.proposer.policy.gate, SamplingParams(max_tokens=30, temperature=0.0,
                                                       ignore_eos=True)
    out: dict[str, list[int]] = {}

    def step():
        for o in eng.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)

    eng.add_request("g0", prompts[0], p)
    eng.add_request("g1", prompts[1], p)
    for _ in range(8):
        step()
    assert counts["overlapped"] >= 5 and len(eng.proposer.backlog) > 0
    eng.add_request("pen", prompts[2], SamplingParams(max_tokens=4, temperature=0.0,
                                                      repetition_penalty=1.3))
    launched = counts["overlapped"]
    while "pen" in eng.seqs:
        step()
    assert counts["overlapped"] == launched and len(eng.proposer.backlog) == 0
    assert not any(eng.proposer.states[r].broken for r in ("g0", "g1"))
    gate.pattern = [True]
    while eng.has_unfinished_requests():
        step()
    drafted = {rid for call in log for rid, d in call if d}
    assert drafted == {"g0", "g1"} and eng.spec_metrics.num_accepted_tokens > 0
    want = _generate(LLM(str(trained_hybrid_dir()), **KW), prompts[:2], p)
    assert [out["g0"], out["g1"]] == want and len(out["pen"]) == 4


def test_shadow_pool_runs_short_where_the_sync_engine_does():
    """Under KV pressure a preempted sequence keeps its MTP shadow blocks, so the shadow pool
    runs short before the target's and a state breaks for good (never drafts again). The
    overlapped plain steps must take shadow blocks step by step as the synchronous observe
    does: taken at the catch-up instead (a run of steps per sequence at once), gen-2's
    state broke where the synchronous engine breaks gen-1's, and the drafts differed."""
    prompts = [[10, 13, 16], [18, 19, 20, 21, 22, 23, 24, 25, 26],
               [50, 52, 54, 56, 58, 60, 62, 2, 4]]
    params = [SamplingParams(max_tokens=32 - len(p), temperature=0.0, ignore_eos=True)
              for p in prompts]
    kw = dict(max_model_len=32, num_kv_blocks=12)
    want = _generate(LLM(str(trained_hybrid_dir()), **{**KW, **kw}), prompts, params)
    runs = {}
    for overlap in (True, False):
        llm, log, counts = engine(overlap, **kw)
        eng, p = llm.engine, llm.engine.proposer
        p.policy.gate.every = 6
        p.policy.prior = 0.6   # the drafts, hence the pool's use, this scenario was built on
        broken, brk = [], p._break

        def first_break(st, brk=brk, broken=broken):
            if not st.broken:
                broken.append(st.shadow.request_id)
            brk(st)

        p._break = first_break
        ids = _generate(llm, prompts, params)
        runs[overlap] = (ids, log, broken, eng.scheduler.num_preemptions, counts["overlapped"])
        assert not p.states and p.bm.num_free_blocks == eng.runner.num_blocks
    (ids, log, broken, preempted, overlapped), (ids0, log0, broken0, preempted0, _) = \
        runs[True], runs[False]
    assert ids == ids0 == want and preempted == preempted0 == 3 and overlapped >= 20
    assert broken0 == ["gen-0", "gen-1"] and broken == broken0
    assert log == log0 and len(log) >= 3


def test_a_sequence_that_cannot_draft_does_not_stop_the_overlap():
    """Steps overlap when the only sequences the policy would let draft cannot: one whose MTP
    state broke for good, or one whose pending token leaves no room for drafts
    (``room_for_drafts`` counts tokens still on the device)."""
    seq = _seq("s", [1, 2, 3], computed=2)
    seq.max_tokens = 3
    seq.output_token_ids = [3]
    assert seq.room_for_drafts == 1
    seq.add_placeholder()
    assert seq.room_for_drafts == 0          # 2 of 3 tokens sampled: the last one only
    llm, log, counts = engine(True, (True,))
    eng, p = llm.engine, llm.engine.proposer
    p.policy.prior = 0.95
    eng.add_request("a", held_out_prompts(1, 6)[0], SamplingParams(max_tokens=20,
                                                                   temperature=0.0,
                                                                   ignore_eos=True))
    for _ in range(4):
        eng.step()
    assert len(log) == 3 and counts["overlapped"] == 1   # the prefill, then it drafts
    p._break(p.states["a"])
    while eng.has_unfinished_requests():
        eng.step()
    assert counts["overlapped"] >= 8 and not any(d for call in log[3:] for _, d in call)


def test_a_request_ending_by_length_leaves_the_shadow_pool_as_in_the_sync_engine():
    """The synchronous engine never observes a request's last step and frees its MTP shadow
    when it drops the request, before the next step's observe. Under async scheduling its
    last step is not admitted to the shadow pool either, and the step that retires it (its
    pending token ends it by length) releases its MTP state before that step's observe, while
    its token is still pending: each step's observe finds the shadow pool as the synchronous
    engine's does."""
    prompts = held_out_prompts(2, 6)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (5, 12)]
    seen = {}
    for overlap in (True, False):
        llm, log, counts = engine(overlap, (False,))
        eng, p = llm.engine, llm.engine.proposer
        name = "observe_launched" if overlap else "observe"
        inner, trace = getattr(p, name), []

        def traced(*a, inner=inner, trace=trace, p=p):   # the pool as each observe finds it
            trace.append((sorted(p.states), p.bm.num_free_blocks))
            return inner(*a)

        setattr(p, name, traced)
        _generate(llm, prompts, params)
        seen[overlap] = trace
        assert not overlap or counts["overlapped"] >= 10
    assert seen[True] == seen[False] and len(seen[True]) >= 10
    assert [s for s, _ in seen[True]][-1] == ["gen-1"]   # gen-0 gone before gen-1's last ones


def test_token_buckets_meet_each_power_of_two_with_and_without_a_multiple_of_16():
    from mtpserve.kernels.compile_ahead import token_buckets

    assert token_buckets(40) == [1, 2, 3, 4, 5, 6, 8, 9, 10, 16, 17, 18, 32, 33, 34]
    assert token_buckets(1) == [1] and token_buckets(0) == []


def test_observe_layouts_cover_each_bucket_packed_spread_and_split():
    """Per token bucket: packed in runs of per_seq (eager SDPA once a run passes 16), spread in
    runs of 16 (the per-token layout of decode catch-ups), split over two; none needs more
    sequences than there are, none repeats."""
    from mtpserve.spec.mtp_compile import observe_layouts

    assert observe_layouts(34, per_seq=20, max_seqs=2) == [
        [1], [2], [1, 1], [3], [1, 2], [4], [2, 2], [5], [2, 3], [6], [3, 3], [8], [4, 4],
        [9], [4, 5], [10], [5, 5], [16], [8, 8], [17], [16, 1], [8, 9], [18], [16, 2], [9, 9],
        [20, 12], [16, 16], [20, 13], [16, 17], [20, 14], [17, 17]]
    assert observe_layouts(40, per_seq=0, max_seqs=4) == []
    assert observe_layouts(3, per_seq=5, max_seqs=0) == []


@pytest.mark.parametrize("kw", [{}, dict(num_kv_blocks=6, max_model_len=64, block_size=16),
                                dict(num_kv_blocks=20, max_model_len=64),
                                dict(num_kv_blocks=2, max_model_len=16, block_size=16)])
def test_compiling_the_observe_shapes_ahead_leaves_the_mtp_as_it_was(kw):
    """The dry observe forwards at start (spec/mtp.py ``compile_observe_shapes``, in the
    layouts of mtp_compile.py) take shadow blocks only while they run, and the K/V they wrote
    is zeroed (on the H200, K/V computed from uninitialised memory made a later draft chain
    read NaN and draft token 0): the pool and the MTP states are as before, and drafting
    afterwards accepts what it accepted without them. Small pools included (two dummy
    sequences of the longest run once overran a pool of 6 blocks: IndexError)."""
    prompts = held_out_prompts(3, 6)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    runs = {}
    for compile_first in (True, False):
        llm, log, _ = engine(False, (True,), **kw)
        p = llm.engine.proposer
        free = p.bm.num_free_blocks
        if compile_first:
            assert p.compile_observe_shapes() > 0
            assert p.bm.num_free_blocks == free and not p.states
            assert not p.runner.kv_cache.tensor.any()   # all zeros again (kv_cache.py)
        runs[compile_first] = (_generate(llm, prompts, params), log,
                               llm.engine.spec_metrics.num_accepted_tokens)
    assert runs[True] == runs[False] and runs[True][2] > 0


def test_a_vetoed_request_is_caught_up_every_16_steps():
    """With every step vetoed, the MTP observes the backlog when it holds 16 steps
    (``SMALL_QUERY``: runs of decode positions then stay on the per-token attention, which a
    graph can replay on CUDA): a 6-token prompt and 40 tokens are 40 launched steps, observed
    in two forwards of 6 + 15 and 16 positions; the last 8 are never observed (the request
    ended)."""
    llm, log, counts = engine(True, (False,))
    p = llm.engine.proposer
    sizes, forward = [], p._observe_forward

    def sized(obs, *a):
        sizes.append([s.num_new_tokens for s in obs.scheduled])
        return forward(obs, *a)

    p._observe_forward = sized
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    _generate(llm, held_out_prompts(1, 6), params)
    assert counts["overlapped"] == counts["observed"] == 40 and log == []
    assert sizes == [[21], [16]]
