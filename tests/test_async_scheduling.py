"""Async scheduling (engine/overlap.py) on the real SmolLM2: every output equals the synchronous
engine's — tokens, text, stops, logprobs — including finishes that the pipeline only sees
one step late, aborts while a step is in flight and drains for penalties. Preemption and chunked
prefill under async scheduling: tests/test_engine_real.py."""

from __future__ import annotations

import copy
from contextlib import contextmanager

import pytest

from mtpserve import SamplingParams

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STORY = "Tell me a story about a cat and a dog who became friends."


def chat_ids(tok, text):
    return list(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                        add_generation_prompt=True, return_dict=False))


@contextmanager
def async_on(llm):
    eng = llm.engine
    eng.async_scheduling = True
    try:
        yield eng
    finally:
        eng.async_scheduling = False
        assert eng._pending is None and eng._unsent == []


# the real model repeats this sentence, so the n-gram proposer finds drafts
REPEATING = "Repeat exactly: the cat sat on the mat. the cat sat on the mat."


@contextmanager
def ngram_gated(eng, gate):
    """``eng`` drafting by n-gram (3 steps) under the load gate ``gate``, with fresh spec
    metrics (yielded); plain decoding again after."""
    from mtpserve.config import SpeculativeConfig
    from mtpserve.spec import build_proposer
    from mtpserve.spec.metrics import SpecMetrics

    eng.proposer = build_proposer(SpeculativeConfig(algorithm="ngram", num_steps=3), eng)
    eng.proposer.policy.gate = gate
    eng.spec_metrics = metrics = SpecMetrics(3)
    try:
        yield metrics
    finally:
        eng.proposer, eng.spec_metrics = None, SpecMetrics(0)


def summary(results):
    """Each choice's tokens, text, finish and logprobs: ids exact, log-probabilities to 4
    decimals (a step's batch differs between the modes, and the CPU's float32 products round
    differently by batch: one step's top-2 differed in the 7th decimal in session 16's setup)."""
    return [[(o.token_ids, o.text, o.finish_reason, o.stop_reason,
              [(lp.token_id, round(lp.logprob, 4), [(t, round(v, 4)) for t, v in lp.top])
               for lp in o.logprobs or []])
             for o in r.outputs] for r in results]


def mixed_requests(tok):
    q, story = chat_ids(tok, QUESTION[0]["content"]), chat_ids(tok, STORY)
    prompts = [q, q, story, story, story, q, story]   # 32 and 44 tokens
    params = [SamplingParams(max_tokens=20, temperature=0.0),                 # ends on EOS
              SamplingParams(max_tokens=20, temperature=0.0, stop=["ce is"]),  # stop string
              SamplingParams(max_tokens=1, temperature=0.0),
              SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2),
              SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=11),
              SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[7042]),
              SamplingParams(max_tokens=5, temperature=1.0, top_k=20, seed=5, n=2)]
    return prompts, params


def test_async_outputs_equal_sync(smollm2_llm):
    llm = smollm2_llm
    prompts, params = mixed_requests(llm.tokenizer)
    want = summary(llm.generate(prompts, params))
    with async_on(llm):
        got = summary(llm.generate(prompts, params))
    assert got == want
    assert want[0][0][1] == "The capital of France is Paris." and want[0][0][2] == "stop"
    assert want[1][0][1] == "The capital of Fran" and want[2][0][2] == "length"


def test_async_runs_no_extra_forward_for_length_limited_requests(smollm2_llm):
    """max_tokens = 5 takes five forwards (a prefill and four decodes) in both modes: a
    request whose pending tokens reach max_tokens is not scheduled again."""
    llm, calls = smollm2_llm, []
    runner = llm.engine.runner
    execute = runner.execute
    runner.execute = lambda batch: calls.append(batch.num_tokens) or execute(batch)
    try:
        ids = chat_ids(llm.tokenizer, STORY)
        p = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        want = llm.generate([ids], p)[0].outputs[0].token_ids
        sync_calls, calls[:] = list(calls), []
        with async_on(llm):
            got = llm.generate([ids], p)[0].outputs[0].token_ids
    finally:
        runner.execute = execute
    assert got == want and len(got) == 5
    assert sync_calls == calls and calls[1:] == [1, 1, 1, 1]   # the prefill (its uncached part), 4 decodes


def test_a_request_ending_by_length_frees_its_slot_for_the_next_step(smollm2_llm):
    """max_num_seqs = 2, three requests of 3 tokens: the synchronous engine admits the third
    in the step after the first two finish. Under async scheduling their last tokens are
    still on the device then, but they end whatever those are: the scheduler retires them and
    admits the third in the same engine call (before, it waited one more call)."""
    llm = smollm2_llm
    eng = llm.engine
    ids = chat_ids(llm.tokenizer, STORY)
    p = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    limit, eng.scheduler.max_num_seqs = eng.scheduler.max_num_seqs, 2
    calls, outs = {}, {}
    try:
        for mode in (False, True):
            eng.async_scheduling = mode
            for rid in ("a", "b", "c"):
                eng.add_request(rid, ids[:-1] if rid == "c" else ids, p)
            n, first = 0, None
            while eng.has_unfinished_requests():
                n += 1
                for o in eng.step():
                    outs.setdefault((mode, o.request_id), []).extend(o.new_token_ids)
                if first is None and any(s.request_id == "c" for s in eng.scheduler.running):
                    first = n
            calls[mode] = first
    finally:
        eng.scheduler.max_num_seqs, eng.async_scheduling = limit, False
    assert calls[True] == calls[False] == 4   # a prefill, two decodes, then c's prefill
    assert all(outs[(True, r)] == outs[(False, r)] and len(outs[(True, r)]) == 3
               for r in "abc")
    assert eng.block_manager.num_free_blocks == eng.runner.num_blocks


def test_async_abort_in_flight_and_drain_for_penalties(smollm2_llm):
    llm = smollm2_llm
    eng, tok = llm.engine, llm.tokenizer
    ids = chat_ids(tok, STORY)
    greedy = SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True)
    alone = llm.generate([ids], greedy)[0].outputs[0].token_ids
    penal = SamplingParams(max_tokens=5, temperature=0.0, repetition_penalty=1.3)
    penal_alone = llm.generate([ids], penal)[0].outputs[0].token_ids
    got = {"keep": [], "drop": [], "pen": []}
    with async_on(llm):
        eng.add_request("keep", ids, greedy)
        eng.add_request("drop", ids, greedy)
        for _ in range(3):
            for o in eng.step():
                got[o.request_id] += o.new_token_ids
        assert eng._pending is not None          # a step is in flight
        eng.abort_request("drop")
        eng.add_request("pen", ids, penal)       # penalties: the next step drains first
        drained = eng.step()
        # keep's pending token, then the synchronous step run after it: pen's first token at
        # once, keep's next with the next call (taken while that call's step runs)
        assert eng._pending is None
        assert [o.request_id for o in drained] == ["keep", "pen"]
        later = eng.step()
        assert [o.request_id for o in later] == ["keep"]
        assert [len(o.new_token_ids) for o in drained + later] == [1, 1, 1]
        for o in drained + later:
            got[o.request_id] += o.new_token_ids
        while eng.has_unfinished_requests():
            for o in eng.step():
                got[o.request_id] += o.new_token_ids
    assert got["keep"] == alone
    assert got["drop"] == alone[:len(got["drop"])] and len(got["drop"]) == 2
    assert got["pen"] == penal_alone


def test_async_prefix_cache_hit_for_a_request_admitted_next_step(smollm2_llm):
    """A prefill's full blocks are published when it is launched (their token ids are known),
    so a request with the same prompt admitted by the very next step reuses them, as when the
    steps are synchronous."""
    llm = smollm2_llm
    eng = llm.engine
    ids = chat_ids(llm.tokenizer, "Name three rivers of Europe and one of Africa, briefly.")
    p = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    got = {}
    with async_on(llm):
        eng.add_request("a", ids, p)
        a = eng.seqs["a"]
        eng.step()                                    # launches a's prefill
        eng.add_request("b", ids, p)
        while eng.has_unfinished_requests():
            for o in eng.step():
                got.setdefault(o.request_id, o.num_cached_tokens)
    # a may hit blocks of the chat template's preamble left by earlier tests; b hits all of a's
    assert got["b"] == (len(ids) - 1) // 16 * 16 > got["a"] and got["b"] >= 32
    # blocks filled while decoding were published at launch: their hashes are those of the real
    # tokens, never of a placeholder
    from mtpserve.engine.block_manager import block_hash

    n = (len(ids) + 19) // 16        # full blocks of prompt + 20 tokens (the last one computed)
    assert n > (len(ids) - 1) // 16 and len(a.output_token_ids) == 20
    h = None
    for i in range(n):
        h = block_hash(h, a.token_ids[i * 16:(i + 1) * 16])
        assert h in eng.block_manager.cached, f"block {i}"


@pytest.mark.parametrize("argv, want", [([], None), (["--async-scheduling"], True),
                                         (["--no-async-scheduling"], False)])
def test_async_scheduling_flag(argv, want, smollm2_llm):
    import argparse

    from mtpserve.engine_args import add_engine_args

    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert p.parse_args(argv).async_scheduling is want
    assert smollm2_llm.engine.async_scheduling is False    # None resolves to CUDA only


class ScriptedGate:
    """Stands in for spec/load_gate.LoadGate: allows drafting on the steps ``pattern`` says."""

    def __init__(self, pattern):
        self.pattern, self.calls, self.records, self.sized = pattern, 0, [], []
        self.switches = []   # (drafted, switch) per record
        self.decisions = []  # what allow answered, in order

    def allow(self, num_seqs):
        self.calls += 1
        self.decisions.append(self.pattern[(self.calls - 1) % len(self.pattern)])
        return self.decisions[-1]

    def exploring(self, num_seqs):
        return False   # drafts priced by the measured times, as a gate that has measured both

    def record(self, num_seqs, drafted, tokens, seconds, switch=False):
        self.records.append((drafted, tokens))
        self.switches.append((drafted, switch))
        self.sized.append((num_seqs, drafted, tokens))


@pytest.mark.parametrize("algo, pattern, budget", [
    ("ngram", (False, False, True), None), ("ngram", (True, False), None),
    ("ngram", (True, False), 8), ("draft", (False, False, True), None),
    ("ngram", (True, True, False), None)])
def test_steps_kept_plain_by_the_gate_overlap(smollm2_llm, algo, pattern, budget):
    """With n-gram drafting, or a draft model (the target itself: it catches up on the tokens
    of the steps it skipped when it next drafts), steps the load gate keeps plain run
    overlapped and steps it lets draft run synchronously; greedy outputs equal plain decoding.
    Plain steps reach the gate also when a drafting step drains them (the alternation (True,
    False) that a new batch-size bucket starts with: each plain step is resolved by the
    drafting step after it). With a token budget of 8, a drafting step leaves some sequences'
    drafts unscheduled; the overlapped step after it must not verify them."""
    from mtpserve.config import SpeculativeConfig
    from mtpserve.spec import build_proposer
    from mtpserve.spec.metrics import SpecMetrics

    llm = smollm2_llm
    eng = llm.engine
    ids = chat_ids(llm.tokenizer, REPEATING)
    p = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    # with the budget, the third sequence's drafts find no room in a drafting step
    prompts = [ids, ids[:-1]] + ([ids[:-2]] if budget else [])
    want = [o.token_ids for r in llm.generate(prompts, p) for o in r.outputs]
    gate = ScriptedGate(list(pattern))
    spec = SpeculativeConfig(algorithm=algo, num_steps=3,
                             draft_model_path="self" if algo == "draft" else None)
    eng.proposer = build_proposer(spec, eng)
    eng.proposer.policy.gate = gate
    if algo == "draft":   # drafting with the target itself never pays: let it draft anyway
        eng.proposer.policy.cost = eng.proposer.policy.draft_cost = 0.0
    eng.spec_metrics = metrics = SpecMetrics(3)
    steps, overlapped = eng._overlapped_step, []
    eng._overlapped_step = lambda *a: overlapped.append(1) or steps(*a)
    full_budget = eng.scheduler.budget
    eng.scheduler.budget = budget or full_budget
    try:
        with async_on(llm):
            got = [o.token_ids for r in llm.generate(prompts, p) for o in r.outputs]
    finally:
        eng.proposer, eng.spec_metrics = None, SpecMetrics(0)
        eng.scheduler.budget = full_budget
        del eng._overlapped_step
    assert got == want
    assert metrics.num_accepted_tokens > 0 and len(overlapped) >= 5
    if algo == "draft":   # after the skipped steps it caught up: it drafts the target's tokens
        assert metrics.num_accepted_tokens == metrics.num_draft_tokens
    assert sum(d for d, _ in gate.records) >= 3
    if budget is None:
        # every plain step (one token per running sequence) and every drafting step is recorded
        plain = [t for drafted, t in gate.records if not drafted]
        assert len(plain) >= 5 and set(plain) <= {1, 2} and plain.count(2) >= 4
        assert len(gate.records) >= gate.calls - 3   # all but the prefill and the last steps
        # each step is filed under the gate's decision on it, in order (the n-gram proposer
        # found no match on some steps it was let draft: they are the drafting arm's too)
        assert [d for d, _ in gate.records] == gate.decisions[:len(gate.records)]
        # a step the gate let draft is a switch exactly when it vetoed the step before
        pairs = list(zip(gate.switches, gate.switches[1:]))
        assert all(switch == (not before) for (before, _), (drafted, switch) in pairs
                   if drafted)
        assert any(not switch for (drafted, switch) in gate.switches if drafted) == (
            pattern == (True, True, False))


def test_gate_files_a_drained_plain_step_under_its_own_batch_size(smollm2_llm):
    """A plain step of 2 sequences is overlapped; one request is aborted before the next step,
    which drafts and so drains the plain step. The gate must file that step under the 2
    sequences it ran, not under the 1 of the step that drained it."""
    llm = smollm2_llm
    eng = llm.engine
    ids = chat_ids(llm.tokenizer, REPEATING)
    p = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    gate = ScriptedGate([False])
    with ngram_gated(eng, gate), async_on(llm):
        eng.add_request("keep", ids, p)
        eng.add_request("drop", ids[:-1], p)
        while any(s.in_prefill for s in eng.scheduler.running) or eng.scheduler.waiting:
            eng.step()
        for _ in range(3):
            eng.step()                           # plain steps of both, overlapped
        assert eng._pending is not None and len(eng._pending.sched.scheduled) == 2
        gate.sized.clear()
        eng.abort_request("drop")
        gate.pattern = [True]                    # the next step drafts: it drains
        eng.step()
        while eng.has_unfinished_requests():
            eng.step()
    assert gate.sized[0][:2] == (2, False), gate.sized


def test_a_step_of_prefills_alone_does_not_consult_the_gate(smollm2_llm):
    """A step whose running sequences are all in prefill cannot draft, so the load gate is not
    asked: a due probe spent there would be lost, and with request lengths a multiple of the
    probe interval every later probe too (session 15, benchmarks/cpu_policy_sim.py). One
    request of 6 tokens, the gate never letting it draft: a prefill step, then 5 decode steps,
    each asking the gate once with its 1 sequence."""
    class SizedGate(ScriptedGate):
        def allow(self, num_seqs):
            self.asked = getattr(self, "asked", []) + [num_seqs]
            return super().allow(num_seqs)

    llm = smollm2_llm
    eng = llm.engine
    gate = SizedGate([False])
    with ngram_gated(eng, gate):
        eng.add_request("r", chat_ids(llm.tokenizer, "Say hello."),
                        SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
        steps = 0
        while eng.has_unfinished_requests():
            eng.step()
            steps += 1
    assert steps == 6 and gate.asked == [1] * 5


def test_the_gates_steps_tile_the_engines_wall_time(smollm2_llm, monkeypatch):
    """Every decode step reaches the gate with the engine's wall time from the end of the step
    before it (recorded or not) to its own end, drafting (synchronous) and plain (overlapped)
    steps alike, so the steps of both arms add up to the time the requests waited; the host's
    work between engine calls (here a fixed 5 clock ticks) is in it. Timed from its own start,
    a synchronous drafting step used to leave that work out while plain steps in a pipeline
    carried it: the drafting arm looked faster than it was. A fake clock that ticks once per
    read makes the intervals exact."""
    from mtpserve.engine import engine as engine_module

    llm = smollm2_llm
    eng = llm.engine
    ids = chat_ids(llm.tokenizer, REPEATING)
    p = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    ticks = iter(range(10 ** 9))

    class Clock:
        @staticmethod
        def perf_counter():
            return float(next(ticks))

    gate = ScriptedGate([True, True, False, False])
    ends = []    # (clock at the record, seconds recorded)
    record = gate.record

    def timed(num_seqs, drafted, tokens, seconds, switch=False):
        # the engine read the clock last; a drafting step's held deltas are its time too
        # (their expected seconds: take_deferred_outputs)
        held = eng.deferred_cost.expect(len(eng._unsent))
        ends.append((Clock.perf_counter() - 1 + held, seconds))
        record(num_seqs, drafted, tokens, seconds, switch)
    gate.record = timed
    monkeypatch.setattr(engine_module, "time", Clock)
    with ngram_gated(eng, gate), async_on(llm):
        eng.add_request("a", ids, p)
        eng.add_request("b", ids[:-1], p)
        while eng.has_unfinished_requests():
            eng.step()
            for _ in range(5):   # the caller's work between engine calls
                Clock.perf_counter()
    assert len(ends) >= 8 and set(d for d, _ in gate.records) == {True, False}
    # each step started where the one before ended
    starts = [now - secs for now, secs in ends]
    assert starts[1:] == [now for now, _ in ends[:-1]]


def test_a_new_requests_first_drafting_step_is_a_switch_and_warmup_leaves_the_gate(
        smollm2_llm):
    """Two requests one after the other, the gate letting every decode step draft: each
    request's first decode step follows a step of prefills alone, so it drafts from scratch
    and is a switch (n-gram indexes the prompt, an MTP has nothing drafted ahead), for the
    second request as for the first. And ``warmup`` (which serves internal requests through the
    gate) leaves the gate's figures and the switch as they were (a review found the gate left
    mid-probe and the next request's first drafting step filed as a probe's measure)."""
    import copy

    from mtpserve.spec.load_gate import LoadGate

    llm = smollm2_llm
    eng = llm.engine
    ids = chat_ids(llm.tokenizer, REPEATING)
    p = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    gate = ScriptedGate([True])
    with ngram_gated(eng, gate):
        llm.generate([ids], p)
        first = len(gate.switches)
        llm.generate([ids], p)
        assert gate.switches[0] == (True, True) and gate.switches[first] == (True, True)
        assert not any(switch for _, switch in gate.switches[1:first] + gate.switches[first + 1:])
        gate = eng.proposer.policy.gate = LoadGate()
        llm.generate([ids], p)
        before = copy.deepcopy(vars(gate))
        eng.warmup()
        assert vars(gate) == before and eng.proposer.policy._last_drafting is False


def test_drafting_steps_under_async_scheduling_equal_sync(smollm2_llm):
    """With n-gram drafting at every step, steps run synchronously under async scheduling and
    give their deltas with the next call (detokenized then, while that call's step runs): every
    output equals the synchronous engine's — tokens, text with and without stop strings, stop
    token ids, logprobs, seeded sampling."""
    llm = smollm2_llm
    eng = llm.engine
    prompts, params = mixed_requests(llm.tokenizer)
    rep = chat_ids(llm.tokenizer, REPEATING)
    prompts += [rep, rep]
    params += [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
               SamplingParams(max_tokens=24, temperature=0.0, stop=["on the"])]
    with ngram_gated(eng, ScriptedGate([True])):
        want = summary(llm.generate(prompts, params))
    with ngram_gated(eng, ScriptedGate([True])) as metrics, async_on(llm):
        got = summary(llm.generate(prompts, params))
    assert got == want
    assert metrics.num_accepted_tokens > 0
    assert want[-1][0][1] == "The cat sat " and want[-1][0][3] == "on the"


def test_a_drafting_steps_deltas_come_with_the_next_call(smollm2_llm):
    """Under async scheduling a synchronous (drafting) step's mid-stream deltas are returned by
    the next call, behind that call's launch; a request's first delta and its last come with
    the call whose step made them; once nothing is left to run the engine is idle. An aborted
    request's deferred delta is dropped."""
    llm = smollm2_llm
    eng = llm.engine
    ids = chat_ids(llm.tokenizer, REPEATING)
    p = SamplingParams(max_tokens=12, temperature=0.0)   # "The cat sat on the mat." + EOS
    alone = llm.generate([ids], p)[0].outputs[0].token_ids
    with ngram_gated(eng, ScriptedGate([True])), async_on(llm):
        eng.add_request("a", ids, p)
        assert eng.step() == [] and eng._pending is not None      # the prefill, launched
        calls = []
        while eng.has_unfinished_requests():
            unsent = [s.request_id for s in eng._unsent]
            calls.append((unsent, [o.new_token_ids for o in eng.step()]))
        # the prefill's token (drained by the first drafting step, which keeps its own delta);
        # that step's token; then the three drafts accepted on it and the bonus; the last
        # step (the period and EOS) with the delta before it
        assert calls == [([], [alone[:1]]), (["a"], [alone[1:2]]),
                         (["a"], [alone[2:6], alone[6:]])]
        assert len(alone) == 8 and eng._unsent == [] and eng._done_at is None

        long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        eng.add_request("b", ids, long)
        while [s.request_id for s in eng._unsent] != ["b"]:
            eng.step()
        eng.add_request("c", ids, long)   # its prefill joins b's drafting step: synchronous
        got = eng.step()
        assert [(o.request_id, len(o.new_token_ids)) for o in got][1:] == [("c", 1)]
        assert [o.request_id for o in got] == ["b", "c"] and eng.seqs["c"].num_pending == 0
        assert sorted(s.request_id for s in eng._unsent) == ["b"]
        eng.step()
        assert sorted(s.request_id for s in eng._unsent) == ["b", "c"]
        eng.abort_request("b")
        assert [o.request_id for o in eng.step()] == ["c"]
        eng.abort_request("c")
        assert eng.has_unfinished_requests()       # c's delta of that step, dropped next call
        assert eng.step() == [] and not eng.has_unfinished_requests()
    assert eng.block_manager.num_free_blocks == eng.runner.num_blocks


def test_an_abort_or_a_stop_delivers_the_deltas_a_step_left_first(smollm2_llm):
    """The server's in-thread loop (engine/async_engine.py) ends streams on an abort of every
    request (Ctrl-C) or a stop. A request that finished in the synchronous step before ends as
    it finished, with all its tokens (its last delta comes at once); one still running gets
    that step's tokens, held for the next call, then the abort."""
    from mtpserve.engine.async_engine import AsyncEngine, _Abort, _Add, _Sink

    class Loop:
        def call_soon_threadsafe(self, f, *args):
            f(*args)

    class Queue(list):
        def put_nowait(self, out):
            self.append(out)

    llm = smollm2_llm
    eng = llm.engine
    ids = chat_ids(llm.tokenizer, REPEATING)
    short = SamplingParams(max_tokens=6, temperature=0.0)
    alone = llm.generate([ids], short)[0].outputs[0]
    for end in ("abort_all", "stop"):
        ae = AsyncEngine(lambda: eng, warmup=False)
        ae.engine = eng
        qa, qb = Queue(), Queue()
        with ngram_gated(eng, ScriptedGate([True])), async_on(llm):
            ae._handle(_Add("a", ids, short, _Sink(Loop(), qa)))
            ae._handle(_Add("b", ids, SamplingParams(max_tokens=50, temperature=0.0),
                            _Sink(Loop(), qb)))
            while "a" in eng.seqs:
                ae._deliver(eng.step())
            assert [s.request_id for s in eng._unsent] == ["b"]   # its delta of that step
            b_has = len(eng.seqs["b"].output_token_ids)
            if end == "abort_all":
                ae._handle(_Abort(None))
            else:
                ae._fail_all("abort")
                eng.abort_request("b")
            while eng.has_unfinished_requests():
                ae._deliver(eng.step())
        assert [t for o in qa for t in o.new_token_ids] == alone.token_ids
        assert qa[-1].finish_reason == "length" and qa[-1].finished
        assert "".join(o.new_text for o in qa) == alone.text
        assert sum(len(o.new_token_ids) for o in qb) == b_has and qb[-1].finish_reason == "abort"
        assert ae._sinks == {}


def test_the_engine_process_sends_the_deltas_a_step_left_before_it_stops(smollm2_llm):
    """``--engine-process``: on a stop, the engine's loop (engine/engine_core.py ``_serve``)
    sends the deltas a drafting step held for the next call before it returns, so the streams
    that the server then ends as aborted carry every token computed (a review found the loop
    returning without them)."""
    import multiprocessing

    from mtpserve.engine.engine_core import _serve

    llm = smollm2_llm
    eng = llm.engine
    ids = chat_ids(llm.tokenizer, REPEATING)
    sent = []
    with ngram_gated(eng, ScriptedGate([True])), async_on(llm):
        eng.add_request("b", ids, SamplingParams(max_tokens=50, temperature=0.0))
        while [s.request_id for s in eng._unsent] != ["b"]:
            sent += [t for o in eng.step() for t in o.new_token_ids]
        held = eng.seqs["b"].output_token_ids[len(sent):]
        assert held   # the drafting step's tokens, not yet sent
        ours, theirs = multiprocessing.Pipe()
        ours.send(("stop",))
        _serve(theirs, eng)
        msgs = []
        while ours.poll(0):
            msgs.append(ours.recv())
        assert [(m[0], [(o.request_id, o.new_token_ids) for o in m[1]]) for m in msgs] == [
            ("out", [("b", held)])]
        assert eng._unsent == []
        eng.abort_request("b")
        while eng.has_unfinished_requests():
            eng.step()


def test_a_drafting_steps_held_deltas_are_its_time_not_the_next_steps(smollm2_llm, monkeypatch):
    """The seconds spent taking a drafting step's held deltas (behind the next launch) count
    as that step's in what the load gate is told, not as the step that takes them. On a clock
    that moves only while a delta is built (1 s each; two requests, one delta each a step),
    every decode step is told 2 s: a plain step its own two deltas, a drafting step the two it
    left (their expected cost), and the step timer is told the same of each drafting step.
    Before, the plain step after a drafting one was told 4 s: at
    64 requests the gate's one-step plain probes then found plain decoding slower than it was
    and kept drafting where it lost (H100, session 39)."""
    import types

    from mtpserve.engine import engine as engine_module
    from mtpserve.engine.deferred_cost import DeferredCost
    from mtpserve.engine.sequence import Sequence

    clock = [0.0]
    monkeypatch.setattr(engine_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    take_output = Sequence.take_output

    def slow_take_output(seq):
        clock[0] += 1.0
        return take_output(seq)
    monkeypatch.setattr(Sequence, "take_output", slow_take_output)

    class TimedGate(ScriptedGate):
        def record(self, num_seqs, drafted, tokens, seconds, switch=False):
            super().record(num_seqs, drafted, tokens, seconds, switch)
            self.told.append((drafted, seconds))

    class EagerGraphs:
        """Stands in for captured graphs, so that synchronous steps reach the step timer."""

        def can_run(self, batch):
            return True

        def step_cost(self, num_tokens):
            return None   # (the policy prices by its model, as on the CPU)

        def run(self, batch):
            runner.graphs = None
            try:
                return runner.execute(batch)
            finally:
                runner.graphs = self

    gate = TimedGate([True, True, False, False])
    gate.told = []
    llm = smollm2_llm
    eng = llm.engine
    eng.deferred_cost = DeferredCost()   # as a new engine's (earlier tests taught it theirs)
    runner, timed = eng.runner, []
    monkeypatch.setattr(runner, "graphs", EagerGraphs())
    monkeypatch.setattr(eng.step_timer, "record",
                        lambda tokens, seqs, wall, *a, **k: timed.append(wall))
    ids = chat_ids(llm.tokenizer, REPEATING)
    p = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    with ngram_gated(eng, gate), async_on(llm):
        eng.add_request("a", ids, p)
        eng.add_request("b", ids, p)
        try:
            while len(gate.told) < 13 and eng.has_unfinished_requests():
                eng.step()
        finally:
            for rid in ("a", "b"):
                eng.abort_request(rid)
            while eng.has_unfinished_requests():
                eng.step()
        # warm-up's own deltas (one request drafting at every step) teach it nothing it keeps
        learned = copy.deepcopy(vars(eng.deferred_cost))
        eng.warmup()
        assert vars(eng.deferred_cost) == learned and learned["_medians"] == {1: 1.0}
    # the first drafting step knows no cost of a held delta yet: told 0 s, and the second
    # carries the first's deltas (2 s) besides its own expected 2 s
    assert gate.told[:2] == [(True, 0.0), (True, 4.0)]
    assert gate.told[2:13] == [(d, 2.0) for d in [False, False, True, True] * 3][:11]
    # the step timer times a drafting step from its own start, past the deltas it takes of
    # the step before, plus the expected seconds of those it leaves: 2 s from the second on
    assert timed[0] == 0.0 and len(timed) >= 7 and set(timed[1:7]) == {2.0}
