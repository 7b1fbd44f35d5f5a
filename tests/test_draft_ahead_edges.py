"""Drafting ahead (spec/draft_ahead.py) where a step must not, or must stop short: stops inside
accepted blocks, min_tokens, logprobs, requests arriving and aborted mid-generation, waiting
requests, a shadow KV pool too small, an FR-Spec token map, padded chain "graphs" with drafts
accepted, and a draft-length policy that changes budgets every step. On the CPU, over the tiny
trained hybrid (drafts get accepted): the output equals plain decoding's and the engine's without
drafting ahead, token for token (and text, finish reason, logprobs)."""

from __future__ import annotations

import json

import pytest

from harness_hybrid import one_thread_module  # noqa: F401 (a fixture)
from harness_mtp_chain import Budgets
from mtpserve import LLM, SamplingParams
from mtpserve.spec.draft_ahead import decodes
from test_draft_ahead import KW, engine, plain
from test_mtp_chain import eager_chain_graphs
from trained_hybrid import held_out_prompts, trained_hybrid_dir

pytestmark = pytest.mark.usefixtures("one_thread_module")


def results(llm: LLM, prompts, params) -> list[tuple]:
    """Per prompt: (token ids, text, finish reason, stop reason, logprobs)."""
    return [(o.token_ids, o.text, o.finish_reason, o.stop_reason, o.logprobs)
            for o in (r.outputs[0] for r in llm.generate(prompts, params))]


def ahead_and_not(prompts, params, setup=None, **kw) -> dict:
    """Per ahead in (True, False): (results, draft log, counts); ``setup(llm)`` runs first."""
    out = {}
    for ahead in (True, False):
        llm, log, counts = engine(trained_hybrid_dir(), ahead, **kw)
        if setup is not None:
            setup(llm)
        out[ahead] = (results(llm, prompts, params), log, counts)
    return out


def check(out: dict, want: list[tuple]) -> None:
    """Both engines gave plain decoding's ``want`` (logprobs: each other's; a verify batch's
    float32 sums differ from a decode step's in the last bits) from the same drafts, and the
    one drafting ahead did so on some steps."""
    (res, log, counts), (res0, log0, _) = out[True], out[False]
    assert res == res0
    assert [r[:4] for r in res] == [w[:4] for w in want]
    assert all((r[4] is None) == (w[4] is None) for r, w in zip(res, want))
    assert log == log0
    assert counts["ahead"] > 0 and counts["used"] > 0


def greedy_outputs(n: int = 6, max_tokens: int = 16) -> tuple[list, list[list[int]]]:
    prompts = held_out_prompts(n, 6)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return prompts, plain(trained_hybrid_dir(), prompts, params)


def test_stop_tokens_and_strings_inside_accepted_blocks():
    """Each request stops at a token of its plain output, 4 to 8 in: a stop token, a stop string
    (one that may match inside a word), or an EOS id (set on the engine). Requests finish in steps
    that went ahead, their drafts made ahead dropped while the others go on."""
    prompts, full = greedy_outputs()
    stops = [out[3 + i % 5] for i, out in enumerate(full)]
    params = []
    for i, t in enumerate(stops):
        if i % 3 == 0:
            params.append(SamplingParams(max_tokens=16, temperature=0.0, stop_token_ids=[t]))
        elif i % 3 == 1:
            stop = f"w{t} " if i % 2 else f" w{t}"
            params.append(SamplingParams(max_tokens=16, temperature=0.0, stop=[stop],
                                         include_stop_str_in_output=i % 2 == 0))
        else:
            params.append(SamplingParams(max_tokens=16, temperature=0.0))
    finished_ahead = []

    def setup(llm):
        llm.engine.eos_token_ids = tuple(stops[2::3])
        p = llm.engine.proposer
        observed = p._observed_ahead

        def counted(items):
            finished_ahead.append(len(p.ahead.rows) - len(items))
            return observed(items)

        p._observed_ahead = counted

    base = LLM(str(trained_hybrid_dir()), **KW)
    base.engine.eos_token_ids = tuple(stops[2::3])
    want = results(base, prompts, params)
    assert [w[2] for w in want] == ["stop"] * len(prompts)
    check(ahead_and_not(prompts, params, setup), want)
    assert sum(finished_ahead) >= 3


def record_ahead(seen: list):
    """A ``setup`` for :func:`ahead_and_not`: each step that goes ahead appends, per sequence it
    verifies, (params, tokens generated so far) to ``seen``."""
    def setup(llm):
        p = llm.engine.proposer
        go = p.verify_ahead

        def went(sched, *a):
            out = go(sched, *a)
            if out is not None:
                seen.extend((s.seq.params, len(s.seq.output_token_ids)) for s in sched.scheduled)
            return out

        p.verify_ahead = went

    return setup


def test_min_tokens_keeps_the_usual_step_until_reached():
    """min_tokens bans the stop token before it is reached (the targets are then not the raw
    argmax): no step goes ahead while a request is below it, steps after it do."""
    prompts, full = greedy_outputs(3)
    params = [SamplingParams(max_tokens=16, temperature=0.0, min_tokens=8,
                             stop_token_ids=[out[2], out[10]]) for out in full]
    want = results(LLM(str(trained_hybrid_dir()), **KW), prompts, params)
    seen = []
    check(ahead_and_not(prompts, params, record_ahead(seen)), want)
    assert all(w[0][2] != f[2] for w, f in zip(want, full))   # the ban changed the output
    assert seen and all(n >= p.min_tokens for p, n in seen)


@pytest.mark.parametrize("row, special, differs_at", [
    (0, "bias", 5), (1, dict(repetition_penalty=5.0), 25)], ids=["logit-bias", "penalty"])
def test_logit_bias_and_penalties_keep_the_usual_step(row, special, differs_at):
    """A greedy request whose target choice is not the raw argmax (a bias that bans a token of
    its plain output; a repetition penalty that changes it once its progression comes back to
    the prompt's tokens): no step goes ahead while it runs, the plain greedy one alone does."""
    prompts, full = greedy_outputs(2, 30)
    if special == "bias":
        special = dict(logit_bias={full[row][differs_at]: -100})
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, **special),
              SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)]
    prompts = [prompts[row], held_out_prompts(3, 6)[2]]
    want = results(LLM(str(trained_hybrid_dir()), **KW), prompts, params)
    got, plain_out = want[0][0], full[row]
    assert got[:differs_at] == plain_out[:differs_at] and got[differs_at] != plain_out[differs_at]
    seen = []
    check(ahead_and_not(prompts, params, record_ahead(seen)), want)
    assert seen and all(p == params[1] for p, _ in seen)


def test_logprobs_equal_without_drafting_ahead():
    prompts, _ = greedy_outputs(4)
    params = [SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True, logprobs=n)
              for n in (0, 2, None, 5)]
    want = results(LLM(str(trained_hybrid_dir()), **KW), prompts, params)
    check(ahead_and_not(prompts, params), want)


def drive(llm: LLM, arrivals: dict[int, list], aborts: dict[int, list[str]]):
    """Step ``llm``'s engine, adding ``arrivals[step]`` ((id, prompt, params) each) and
    aborting ``aborts[step]`` before that step. Returns each request's token ids and the
    aborted requests that had drafts made ahead for the next step."""
    eng, out, step, dropped = llm.engine, {}, 0, []
    while step <= max(arrivals) or eng.has_unfinished_requests():
        for rid, prompt, params in arrivals.get(step, []):
            eng.add_request(rid, prompt, params)
            out[rid] = []
        for rid in aborts.get(step, []):
            made = eng.proposer._ahead_drafts
            dropped += [rid] if made is not None and rid in made[1] else []
            eng.abort_request(rid)
        for o in eng.step():
            out[o.request_id].extend(o.new_token_ids)
        step += 1
    return out, dropped


@pytest.mark.parametrize("max_num_seqs", [8, 2])
def test_requests_arriving_and_aborted_while_others_verify(max_num_seqs):
    """Prefills join verify steps (those steps go ahead for the verifying sequences, the
    prefill chunks are observed the usual way), a request is aborted right after a step that
    drafted for it ahead, and (2 at a time) requests wait for a free place."""
    prompts = held_out_prompts(6, 6)
    params = SamplingParams(max_tokens=18, temperature=0.0, ignore_eos=True)
    arrivals = {0: [("a", prompts[0], params), ("b", prompts[1], params)],
                3: [("c", prompts[2], params)], 4: [("d", prompts[3], params)],
                7: [("e", prompts[4], params), ("f", prompts[5], params)]}
    aborts = {6: ["b"]}
    kw = dict(max_num_seqs=max_num_seqs)
    want = dict(zip("acdef", plain(trained_hybrid_dir(), [prompts[i] for i in (0, 2, 3, 4, 5)],
                                   params, **kw)))
    got = {}
    for ahead in (True, False):
        llm, log, counts = engine(trained_hybrid_dir(), ahead, **kw)
        p, beside = llm.engine.proposer, []
        went = p.verify_ahead

        def logged(sched, *a):
            out = went(sched, *a)
            beside.append(out is not None and not all(decodes(s) for s in sched.scheduled))
            return out

        p.verify_ahead = logged
        ids, dropped = drive(llm, arrivals, aborts)
        got[ahead] = (ids, log)
        assert dropped == (["b"] if ahead else [])
        if ahead:
            assert counts["ahead"] > 0 and counts["used"] > 0 and any(beside)
    ids, ids0 = got[True][0], got[False][0]
    assert {r: ids[r] for r in want} == want and {r: ids0[r] for r in want} == want
    assert ids["b"] == ids0["b"] and 0 < len(ids["b"]) < 18
    assert got[True][1] == got[False][1]


def test_a_shadow_pool_too_small_breaks_drafting_not_output():
    """8 blocks of 4 for 4 requests of up to 26 tokens: the target preempts, and the MTP's
    shadows (their own pool of the same size) run out of blocks, ahead or not."""
    prompts = held_out_prompts(4, 6)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    kw = dict(max_model_len=32, num_kv_blocks=8)
    want = plain(trained_hybrid_dir(), prompts, params, **kw)
    for ahead in (True, False):
        llm, _, counts = engine(trained_hybrid_dir(), ahead, **kw)
        p = llm.engine.proposer
        broken, brk = [], p._break
        p._break = lambda st: (broken.append(st.shadow.request_id), brk(st))
        assert [r.outputs[0].token_ids for r in llm.generate(prompts, params)] == want
        assert llm.engine.scheduler.num_preemptions > 0 and broken
        if ahead:
            assert counts["ahead"] > 0


def test_fr_spec_token_map(tmp_path):
    """A map without some tokens the MTP would draft: drafts ahead come from the map's head."""
    prompts, full = greedy_outputs(4)
    emitted = sorted({t for out in full for t in out})
    path = tmp_path / "map.json"
    path.write_text(json.dumps(emitted[: len(emitted) * 3 // 4]))
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    want = results(LLM(str(trained_hybrid_dir()), **KW), prompts, params)
    out = ahead_and_not(prompts, params, speculative_token_map=str(path))
    check(out, want)
    kept = set(emitted[: len(emitted) * 3 // 4])
    assert all(set(d) <= kept for call in out[True][1] for _, d in call)


def test_padded_chain_graphs_with_drafts_accepted():
    """Chain "graphs" (replayed eagerly) of 1, 2, 4 rows: 3 rows pad to 4, and each row's
    layout is picked on the device from every acceptance's (the trained model accepts 0..k)."""
    prompts, _ = greedy_outputs(5)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
              for n in (6, 9, 12, 16, 20)]
    want = results(LLM(str(trained_hybrid_dir()), **KW), prompts, params)
    replays = []
    check(ahead_and_not(prompts, params,
                        lambda llm: replays.append(eager_chain_graphs(llm, 4))), want)
    assert len(replays) == 2 and all(r.get(4, 0) > 0 for r in replays)


def test_a_policy_that_changes_budgets_every_step():
    """Budgets (harness_mtp_chain.py): 0..k drafts per request, changing every step: steps
    mixing drafting and non-drafting sequences go ahead too (a row without drafts observes its
    one position and accepts nothing), and drafts made ahead for k are cut to the smaller
    budget the policy gives next."""
    prompts, _ = greedy_outputs(3)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    want = results(LLM(str(trained_hybrid_dir()), **KW), prompts, params)

    def policy(llm):
        llm.engine.proposer.policy = Budgets(3)

    check(ahead_and_not(prompts, params, policy), want)


def test_a_sequence_left_unscheduled_drafts_by_chain_beside_those_made_ahead():
    """A token budget of two full verify steps (4 tokens each) for four requests whose draft
    budgets change every step (Budgets): some steps go ahead while a running request waits
    unscheduled, so the next step's drafts made ahead miss it: the others take theirs, it gets
    one chain from its own MTP output (drafts of both kinds in one step)."""
    prompts, _ = greedy_outputs(4)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    kw = dict(max_num_batched_tokens=8)
    want = results(LLM(str(trained_hybrid_dir()), **{**KW, **kw}), prompts, params)
    mixed = []

    def setup(llm):
        p = llm.engine.proposer
        p.policy, ahead_rows = Budgets(3), p._ahead_rows

        def rows(active):
            out = ahead_rows(active)
            mixed.append(any(r is None for r in out) and any(r is not None for r in out))
            return out

        p._ahead_rows = rows

    check(ahead_and_not(prompts, params, setup, **kw), want)
    assert any(mixed)


def test_a_step_that_cannot_go_ahead_takes_no_shadow_blocks():
    """Beside a request with a penalty (its rows need the host's logits processing) no step
    goes ahead: the greedy requests' shadows hold, step after step, the blocks they hold
    without drafting ahead (none grown for an unused plan)."""
    prompts = held_out_prompts(3, 6)
    greedy = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    # the sampling request outlives the greedy ones (a decode row without drafts may go ahead
    # beside drafting ones, so a greedy pair alone at their end would)
    params = [greedy, greedy, SamplingParams(max_tokens=30, temperature=0.8, seed=1,
                                             ignore_eos=True, presence_penalty=0.5)]
    blocks = {}
    for ahead in (True, False):
        llm, _, counts = engine(trained_hybrid_dir(), ahead)
        eng, p = llm.engine, llm.engine.proposer
        for i, (prompt, param) in enumerate(zip(prompts, params)):
            eng.add_request(str(i), prompt, param)
        blocks[ahead] = []
        while eng.has_unfinished_requests():
            eng.step()
            blocks[ahead].append({r: len(st.shadow.block_table) for r, st in p.states.items()})
        assert counts["ahead"] == 0
    assert blocks[True] == blocks[False]


def prefill_first(llm: LLM, seen: list) -> None:
    """Reorder each schedule so its prefill chunks come before its decoding rows (the in-tree
    scheduler puts running sequences' decode rows first; ``ModelRunner.prepare``, the state
    cache rows and verify take any order), and log, per step that goes ahead, whether a row
    going ahead comes after a prefill chunk (tokens and logits rows shifted apart)."""
    eng, p = llm.engine, llm.engine.proposer
    schedule, go = eng.scheduler.schedule, p.verify_ahead

    def reordered():
        out = schedule()
        out.scheduled = ([s for s in out.scheduled if not decodes(s)]
                         + [s for s in out.scheduled if decodes(s)])
        return out

    def went(sched, *a):
        out = go(sched, *a)
        if out is not None:
            kinds = [decodes(s) for s in sched.scheduled]
            seen.append(not kinds[0] and any(kinds))
        return out

    eng.scheduler.schedule, p.verify_ahead = reordered, went


@pytest.mark.parametrize("budget", [64, 7])
def test_prefill_chunks_before_the_rows_that_go_ahead(budget):
    """Prefill chunks (some ending their prompt and sampling one row, some not) laid out before
    the verifying rows: acceptance, the observe batch and the pick of the MTP output index
    tokens and logits rows apart; output equals plain decoding, drafts equal the usual step's."""
    prompts = held_out_prompts(6, 6) + held_out_prompts(2, 13, seed=7)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    arrivals = {0: [("a", prompts[0], params), ("b", prompts[1], params)],
                2: [("c", prompts[6], params)], 3: [("d", prompts[2], params)],
                5: [("e", prompts[7], params), ("f", prompts[3], params)],
                8: [("g", prompts[4], params)]}
    order = [0, 1, 6, 2, 7, 3, 4]
    kw = dict(max_num_batched_tokens=budget)
    want = dict(zip("abcdefg", plain(trained_hybrid_dir(), [prompts[i] for i in order],
                                     params, **kw)))
    got = {}
    for ahead in (True, False):
        llm, log, counts = engine(trained_hybrid_dir(), ahead, **kw)
        seen = []
        prefill_first(llm, seen)
        ids, _ = drive(llm, arrivals, {})
        got[ahead] = (ids, log)
        if ahead:
            assert counts["ahead"] > 0 and counts["used"] > 0 and any(seen)
    assert got[True][0] == want and got[False][0] == want
    assert got[True][1] == got[False][1]


def test_one_token_prompts_join_verify_steps():
    """A one-token prompt samples its first row with one new token (``decodes``) but has no
    MTP state yet: the step it joins goes the usual way; output and drafts as without
    drafting ahead."""
    prompts = held_out_prompts(4, 6)
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    arrivals = {0: [("a", prompts[0], params), ("b", prompts[1], params)],
                3: [("c", prompts[2][:1], params)], 4: [("d", prompts[3][:1], params)]}
    want = dict(zip("abcd", plain(trained_hybrid_dir(), [prompts[0], prompts[1],
                                                         prompts[2][:1], prompts[3][:1]],
                                  params)))
    got = {}
    for ahead in (True, False):
        llm, log, counts = engine(trained_hybrid_dir(), ahead)
        ids, _ = drive(llm, arrivals, {})
        got[ahead] = (ids, log)
        if ahead:
            assert counts["ahead"] > 0 and counts["used"] > 0
    assert got[True][0] == want and got[False][0] == want
    assert got[True][1] == got[False][1]


def test_a_prefill_row_that_is_not_plain_keeps_the_usual_step():
    """Requests whose only sampling row is their prefill's (max_tokens=1) join verify steps:
    one sampled, one greedy with a bias that bans its plain first token, one with a repetition
    penalty. The engine verifies with the targets decided ahead only when every sampling row
    is plain (greedy or sampled: spec/sampled_ahead.py), so the steps with the bias or the
    penalty go the usual way, the sampled one's goes ahead: all tokens are plain decoding's."""
    prompts = held_out_prompts(5, 6)
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    first = plain(trained_hybrid_dir(), prompts[2:3], SamplingParams(max_tokens=1,
                                                                     temperature=0.0))[0][0]
    one = [SamplingParams(max_tokens=1, temperature=0.8, seed=3),
           SamplingParams(max_tokens=1, temperature=0.0, logit_bias={first: -100}),
           SamplingParams(max_tokens=1, temperature=0.0, repetition_penalty=5.0)]
    arrivals = {0: [("a", prompts[0], greedy), ("b", prompts[1], greedy)],
                2: [("c", prompts[2], one[1])], 3: [("d", prompts[3], one[0])],
                4: [("e", prompts[4], one[2])]}
    base = LLM(str(trained_hybrid_dir()), **KW)
    want = {"a": plain(trained_hybrid_dir(), prompts[:1], greedy)[0],
            "b": plain(trained_hybrid_dir(), prompts[1:2], greedy)[0]}
    want.update({r: base.generate([prompts[i]], [p])[0].outputs[0].token_ids
                 for r, i, p in (("c", 2, one[1]), ("d", 3, one[0]), ("e", 4, one[2]))})
    assert want["c"] != [first]
    got = {}
    for ahead in (True, False):
        llm, log, counts = engine(trained_hybrid_dir(), ahead)
        beside = []
        p, go = llm.engine.proposer, llm.engine.proposer.verify_ahead

        def went(sched, *a):
            out = go(sched, *a)
            beside.append((out is not None, [s.seq.request_id for s in sched.scheduled]))
            return out

        p.verify_ahead = went
        ids, _ = drive(llm, arrivals, {})
        got[ahead] = (ids, log)
        if ahead:
            assert counts["ahead"] > 0
            assert not any(w and set(r) & set("ce") for w, r in beside)
            assert any(set(r) & set("ce") for w, r in beside)
            assert any(w and "d" in r for w, r in beside)
    assert got[True][0] == want and got[False][0] == want
    assert got[True][1] == got[False][1]


def test_sampled_requests_at_the_edges_emit_the_usual_tokens():
    """Sampling requests going ahead (spec/sampled_ahead.py) where the greedy tests above go:
    min_tokens (no step goes ahead while a request is below it, its steps past it do),
    stop tokens and strings met inside accepted blocks, n = 3 fan-out (seed + i each), the
    shared generator, temperatures of 1e-5 and 50, top-k 1, logprobs, with the token budget
    cutting drafts and chunking prompts: the same tokens, text, finish reasons and logprobs as
    without drafting ahead, from the same drafts. (Whether a step lands exactly on a
    min_tokens depends on the trained weights' acceptance, which has moved between sessions: 7
    and 5 did under an earlier transformers, 8 and 6 under 5.24's in session 17, neither on
    2026-12-03 with the same transformers 5.24.0 (the request of min_tokens 8 went ahead at 9,
    11, 13; cause not found); so the test asks for steps past it, not at it.)"""
    prompts, full = greedy_outputs(7)
    params = [
        SamplingParams(max_tokens=16, temperature=0.8, seed=1, min_tokens=8,
                       stop_token_ids=[full[0][2], full[0][8]]),
        SamplingParams(max_tokens=16, temperature=0.9, min_tokens=6, stop_token_ids=[5, 9]),
        SamplingParams(max_tokens=16, temperature=0.7, stop=[f"w{full[2][4]}"], seed=3),
        SamplingParams(max_tokens=12, temperature=4.0, n=3, seed=4, ignore_eos=True),
        SamplingParams(max_tokens=14, temperature=1e-5, top_k=1, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=14, temperature=50.0, seed=6, ignore_eos=True),
        SamplingParams(max_tokens=14, temperature=0.6, stop_token_ids=[full[6][5]]),
    ]
    for kw in ({}, dict(max_num_batched_tokens=7)):
        got, seen = {}, []
        for ahead in (True, False):
            llm, log, counts = engine(trained_hybrid_dir(), ahead, **kw)
            if ahead:
                record_ahead(seen)(llm)
            outs = [[(o.token_ids, o.text, o.finish_reason, o.stop_reason,
                      [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs or []])
                     for o in r.outputs] for r in llm.generate(prompts, params)]
            got[ahead] = (outs, log, counts)
        assert got[True][:2] == got[False][:2]
        outs, counts = got[True][0], got[True][2]
        assert counts["ahead"] >= 5 and counts["used"] > 0
        assert len(outs[3]) == 3 and len({tuple(o[0]) for o in outs[3]}) > 1   # seed + i
        assert {o[2] for r in outs for o in r} == {"stop", "length"}
        # min_tokens: steps with a request below it never went ahead; once past it, the
        # request's steps do (whether one lands exactly on it depends on acceptance)
        assert all(n >= p.min_tokens for p, n in seen)
        assert any(p.min_tokens for p, n in seen)


@pytest.mark.parametrize("max_num_seqs", [8, 2])
def test_sampled_requests_arriving_and_aborted_on_the_shared_generator(max_num_seqs):
    """The shared generator serves every unseeded sampling row in batch order: requests
    arriving (their prefill rows joining steps that go ahead), aborted right after a step that
    drafted for them ahead, and waiting for a place change which rows draw from it, in the same
    way ahead or not: the same tokens and drafts. (Passed when added.)"""
    prompts = held_out_prompts(6, 6)
    sampled = [SamplingParams(max_tokens=18, temperature=t, seed=s, ignore_eos=True)
               for t, s in ((0.8, None), (1.2, None), (0.7, 11), (1.0, None), (0.9, 12),
                            (1.1, None))]
    arrivals = {0: [("a", prompts[0], sampled[0]), ("b", prompts[1], sampled[1])],
                3: [("c", prompts[2], sampled[2])], 4: [("d", prompts[3], sampled[3])],
                7: [("e", prompts[4], sampled[4]), ("f", prompts[5], sampled[5])]}
    aborts = {6: ["b"], 9: ["d"]}
    got = {}
    for ahead in (True, False):
        llm, log, counts = engine(trained_hybrid_dir(), ahead, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=9)
        ids, dropped = drive(llm, arrivals, aborts)
        got[ahead] = (ids, log, counts, dropped)
    assert got[True][:2] == got[False][:2]
    assert got[True][2]["ahead"] > 0 and got[True][2]["used"] > 0
    assert got[True][3] and not got[False][3]    # an abort dropped drafts made ahead
