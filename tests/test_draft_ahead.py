"""Greedy MTP steps that observe and draft before the host reads the verify step back
(spec/draft_ahead.py), on the CPU.

The acceptance kernel against hand-made batches; then whole engines, drafting ahead and not
(``MTPProposer.draft_ahead``), over the tiny trained hybrid (drafts get accepted: 0..k per step)
and a random MTP layer (nothing accepted): the same drafts step by step, the same acceptance
counts, and plain decoding's tokens, also when max_tokens / max_model_len shrink the next
budgets, when the token budget cuts drafts, under preemption, with padded chain "graphs"; and
sampling requests, whose rows the device decides by speculative sampling (spec/sampled_ahead.py):
the same tokens as the host's verification."""

from __future__ import annotations

import pytest
import torch

from harness_hybrid import one_thread
from hybrid_checkpoint import random_mtp_checkpoint
from mtpserve import LLM, SamplingParams
from mtpserve.spec.draft_ahead import greedy_acceptance, observe_inputs
from test_mtp_chain import eager_chain_graphs
from trained_hybrid import held_out_prompts, trained_hybrid_dir

K = 3
KW = dict(dtype="float32", max_model_len=128, num_kv_blocks=128, block_size=4, max_num_seqs=8)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


def test_acceptance_is_the_longest_matching_prefix():
    # three sequences: 3 drafts (first two match), 1 draft (matches), 2 drafts (first differs)
    ids = torch.tensor([50, 7, 8, 9, 60, 5, 70, 4, 4])
    targets = torch.tensor([7, 8, 1, 2, 5, 3, 9, 4, 6])
    firsts = [0, 4, 6]
    accepted = greedy_acceptance(targets, ids, firsts, firsts, [3, 1, 2], 3)
    assert accepted.tolist() == [2, 1, 0]
    all_match = greedy_acceptance(torch.tensor([7, 8, 9, 3]), torch.tensor([1, 7, 8, 9]),
                                  [0], [0], [3], 3)
    assert all_match.tolist() == [3]
    # two sequences of 3 drafts back to back (compared as views): 1 and 3 accepted
    two = greedy_acceptance(torch.tensor([7, 5, 1, 1, 4, 3, 2, 8]),
                            torch.tensor([9, 7, 6, 1, 9, 4, 3, 2]), [0, 4], [0, 4], [3, 3], 3)
    assert two.tolist() == [1, 3]
    # decode rows without drafts (first and last in the batch) accept nothing
    mixed = greedy_acceptance(torch.tensor([5, 7, 8, 6]), torch.tensor([9, 1, 7, 7]),
                              [0, 1, 3], [0, 1, 3], [0, 2, 0], 2)
    assert mixed.tolist() == [0, 1, 0]
    # a prefill chunk of 3 tokens (no logits row) between two verifying sequences: tokens and
    # logits rows no longer line up
    ids = torch.tensor([40, 7, 8, 11, 12, 13, 41, 3])
    targets = torch.tensor([7, 9, 0, 3, 5])
    assert greedy_acceptance(targets, ids, [0, 3], [0, 6], [2, 1], 2).tolist() == [1, 1]


def test_observe_inputs_pick_the_verifying_rows():
    # the same batch: the observe batch takes the two sequences' rows, not the prefill chunk
    targets = torch.tensor([7, 9, 0, 3, 5])
    hidden = torch.arange(8.0).unsqueeze(1)
    ids, h = observe_inputs(targets, hidden, [0, 6], [0, 3], [2, 1])
    assert ids.tolist() == [7, 9, 0, 3, 5] and h.flatten().tolist() == [0, 1, 2, 6, 7]
    ids, h = observe_inputs(targets[3:], hidden[6:], [0], [0], [1])   # the whole batch: views
    assert ids.data_ptr() == targets[3:].data_ptr() and h.data_ptr() == hidden[6:].data_ptr()


def engine(path, ahead: bool, **kw):
    """An MTP engine (no draft-length policy: every sequence drafts up to k) logging, per
    draft call, each sequence's drafts, and counting the steps it went ahead."""
    llm = LLM(str(path), speculative_algorithm="nextn", speculative_num_steps=K,
              speculative_adaptive=False, **{**KW, **kw})
    p = llm.engine.proposer
    p.draft_ahead = ahead
    log, counts, draft, go = [], {"ahead": 0, "used": 0}, p.draft, p.verify_ahead

    def logged(work):
        used = p._ahead_drafts is not None
        draft(work)
        pend = p.pending
        log.append([(s.request_id, pend.drafts[pend.rows[s.request_id]].tolist()
                     [:len(s.draft_token_ids)] if pend and s.request_id in pend.rows
                     else list(s.draft_token_ids)) for s, _ in work])
        counts["used"] += used and pend is not None

    def went(*a):
        out = go(*a)
        counts["ahead"] += out is not None
        return out

    p.draft, p.verify_ahead = logged, went
    return llm, log, counts


def run(path, prompts, params, **kw):
    """Per ahead in (True, False): (token ids, draft log, counts, spec metrics)."""
    out = {}
    for ahead in (True, False):
        llm, log, counts = engine(path, ahead, **kw)
        ids = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
        m = llm.engine.spec_metrics
        out[ahead] = (ids, log, counts, (m.num_draft_tokens, m.num_accepted_tokens,
                                         list(m.accepted_per_step)))
    return out


def plain(path, prompts, params, **kw):
    return [r.outputs[0].token_ids for r in LLM(str(path), **{**KW, **kw}).generate(prompts,
                                                                                  params)]


@pytest.mark.parametrize("kw", [{}, dict(max_num_batched_tokens=5),
                                dict(max_model_len=32, num_kv_blocks=10)],
                         ids=["default", "drafts-cut-by-the-token-budget", "preemption"])
def test_trained_model_drafts_ahead_as_the_usual_step(kw):
    path, prompts = trained_hybrid_dir(), held_out_prompts(6, 6)
    # different max_tokens: the next budget depends on how much gets accepted near the end
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
              for n in (5, 9, 14, 14, 11, 20)]
    if "max_model_len" in kw:
        params = [SamplingParams(max_tokens=26, temperature=0.0, ignore_eos=True)] * 6
    out = run(path, prompts, params, **kw)
    want = plain(path, prompts, params, **kw)
    (ids, log, counts, metrics), (ids0, log0, counts0, metrics0) = out[True], out[False]
    assert ids == want and ids0 == want
    assert log == log0 and metrics == metrics0
    assert metrics[1] > 0                        # drafts were accepted
    assert counts["ahead"] > 0 and counts["used"] > 0
    assert counts0 == {"ahead": 0, "used": 0}


def test_random_mtp_with_padded_chain_graphs(tmp_path):
    path = random_mtp_checkpoint(tmp_path / "tiny")[0]
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 256, (n,), generator=g).tolist() for n in (5, 11, 3, 17, 8)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
              for n in (4, 7, 10, 13, 16)]
    want = plain(path, prompts, params)
    logs = {}
    for ahead in (True, False):
        llm, log, counts = engine(path, ahead)
        replays = eager_chain_graphs(llm, max_seqs=4)   # 1, 2, 4 rows: 5 rows run eagerly
        assert [r.outputs[0].token_ids for r in llm.generate(prompts, params)] == want
        logs[ahead] = log
        if ahead:
            assert counts["used"] > 0 and replays.get(4, 0) > 0 and replays.get(1, 0) > 0
    assert logs[True] == logs[False]


SAMPLED = [SamplingParams(max_tokens=14, temperature=0.8, seed=5),
           SamplingParams(max_tokens=11, temperature=1.0, top_p=0.9, seed=6, logprobs=2),
           SamplingParams(max_tokens=16, temperature=0.6, top_k=20, seed=7, ignore_eos=True),
           SamplingParams(max_tokens=9, temperature=0.7, min_p=0.1, seed=8),
           SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
           SamplingParams(max_tokens=13, temperature=0.9, ignore_eos=True)]   # shared generator


def test_sampled_requests_draft_ahead_as_the_usual_step():
    """Sampling requests (one-hot drafts: the MTP's argmax) go ahead too, their rows decided by
    speculative sampling on the device (spec/sampled_ahead.py): the same tokens, logprobs,
    drafts and acceptance as the host's verification, seeded or on the shared generator,
    beside a greedy request."""
    path, prompts = trained_hybrid_dir(), held_out_prompts(6, 6)
    out, lps, verifying = {}, {}, []
    for ahead in (True, False):
        llm, log, counts = engine(path, ahead)
        go = llm.engine.proposer.verify_ahead

        def counted(sched, *a, go=go):
            verifying.append(any(s.draft_token_ids for s in sched.scheduled))
            return go(sched, *a)

        llm.engine.proposer.verify_ahead = counted
        res = llm.generate(prompts, SAMPLED)
        m = llm.engine.spec_metrics
        out[ahead] = ([r.outputs[0].token_ids for r in res], log, counts,
                      (m.num_draft_tokens, m.num_accepted_tokens, list(m.accepted_per_step)))
        lps[ahead] = [[(lp.token_id, lp.logprob, lp.top) for lp in r.outputs[0].logprobs]
                      for r in res if r.outputs[0].logprobs]
    (ids, log, counts, metrics), (ids0, log0, counts0, metrics0) = out[True], out[False]
    assert ids == ids0 and log == log0 and metrics == metrics0 and lps[True] == lps[False]
    hist = metrics[2]   # verify steps by drafts accepted: some accept, some reject
    assert metrics[1] > 0 and sum(hist[1:]) > 0 and hist[K] < sum(hist)
    steps = sum(verifying) // 2   # every verify step went ahead (the run without: none)
    assert counts["ahead"] == steps >= 5 and counts["used"] > 0
    assert counts0 == {"ahead": 0, "used": 0}
    want = plain(path, prompts[4:5], SAMPLED[4])   # the greedy one: plain decoding's tokens
    assert ids[4] == want[0]


def test_drafts_drawn_from_q_keep_the_usual_step():
    """With ``sampled_drafts`` (drafts drawn step by step, their q kept on the host) a step
    with a sampling request does not go ahead; once that request is done the greedy ones do."""
    path, prompts = trained_hybrid_dir(), held_out_prompts(3, 6)
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    params = [greedy, greedy, SamplingParams(max_tokens=4, temperature=0.8, seed=5)]
    llm, log, counts = engine(path, True)
    llm.engine.proposer.sampled_drafts = True
    went = []
    go = llm.engine.proposer.verify_ahead

    def logged(sched, *a):
        out = go(sched, *a)
        went.append((any(not s.seq.params.greedy for s in sched.scheduled), out is not None))
        return out

    llm.engine.proposer.verify_ahead = logged
    outs = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs[:2]] == plain(path, prompts[:2], greedy)
    assert not any(g for sampled, g in went if sampled) and any(g for _, g in went)


def test_the_adaptive_policy_plans_the_chain_ahead_as_it_will_ask():
    """With the adaptive draft-length policy, drafts planned ahead for each acceptance are
    what the policy then asks (``DraftLengthPolicy.num_drafts_after``), not k: for every
    sequence the next step's budget is the one planned for the acceptance that happened, the
    chain runs fewer steps where the policy asks fewer, and only the step after the prefill
    needs the usual chain. Tokens, drafts and acceptance equal the run without drafting
    ahead."""
    path, prompts = trained_hybrid_dir(), held_out_prompts(6, 6)
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)] * 6
    runs = {}
    for ahead in (True, False):
        llm = LLM(str(path), speculative_algorithm="nextn", speculative_num_steps=K,
                  speculative_adaptive=True, **KW)
        p = llm.engine.proposer
        p.draft_ahead = ahead
        events, usual, variants, go = [], p._chain_drafts, p.chain.run_variants, p.verify_ahead

        def counted(active, usual=usual):
            events.append(("usual", None))
            return usual(active)

        def planned(hidden, rows, accepted, steps, variants=variants):
            events.append(("steps", steps))
            return variants(hidden, rows, accepted, steps)

        def logged(work, draft=p.draft):
            events.append(("draft", {s.request_id: b for s, b in work}))
            draft(work)

        def went(*a, go=go):
            out = go(*a)
            events.append(("ahead", out))
            return out

        p._chain_drafts, p.chain.run_variants, p.draft, p.verify_ahead = (counted, planned,
                                                                          logged, went)
        ids = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
        m = llm.engine.spec_metrics
        drafts = [e for kind, e in events if kind == "draft"]
        runs[ahead] = (ids, drafts, list(m.accepted_per_step), events)
    assert runs[True][:3] == runs[False][:3]
    assert runs[True][0] == plain(path, prompts, params)
    events = runs[True][3]
    checked, last = 0, None
    for kind, e in events:
        if kind == "ahead":
            last = e
        elif kind == "draft" and last is not None:
            for rid, budget in e.items():
                row = last.rows.get(rid)
                if row is not None:
                    assert budget == last.budgets[row][last.accepted(row)]
                    checked += 1
    assert checked >= 30
    kinds = [k for k, _ in events]
    steps = [e for k, e in events if k == "steps"]
    assert kinds.count("usual") == 1 and len(steps) >= 10
    assert min(steps) < K and max(steps) == K   # the policy's budgets, not always k


def test_a_short_mtp_pool_drafts_as_the_usual_step():
    """The MTP's shadow pool (as many blocks as the target's) runs short under preemption.
    Drafting ahead grows each shadow for every acceptance's chain; it must not leave the pool
    shorter than the usual step does (a shadow that then finds no block is broken for good, a
    chain cut shorter): the same drafts, acceptance and preemptions as without drafting
    ahead, not only the same greedy tokens. Two pool sizes: where preemption strikes depends on
    the trained weights' acceptance (32 blocks preempted with the weights trained under an
    earlier transformers and not under 5.24's, 28 blocks the other way round), so between them
    it strikes."""
    path, prompts = trained_hybrid_dir(), held_out_prompts(8, 6, seed=5)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
              for n in (20, 7, 15, 25, 11, 26, 9, 18)]
    preemptions = went_ahead = 0
    for blocks in (28, 32):
        kw = dict(max_model_len=64, num_kv_blocks=blocks)
        runs = {}
        for ahead in (True, False):
            llm, log, counts = engine(path, ahead, **kw)
            ids = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
            m = llm.engine.spec_metrics
            runs[ahead] = (ids, log, (m.num_draft_tokens, m.num_accepted_tokens,
                                      list(m.accepted_per_step)),
                           llm.engine.scheduler.num_preemptions, counts)
        assert runs[True][0] == runs[False][0] == plain(path, prompts, params, **kw), blocks
        assert runs[True][1:4] == runs[False][1:4], blocks
        preemptions += runs[True][3]
        went_ahead += runs[True][4]["ahead"]
    assert preemptions > 0 and went_ahead >= 5


def test_sampled_requests_under_a_short_mtp_pool_emit_the_usual_tokens():
    """Sampling requests draw from their generators once per draft: a sequence drafting
    ahead must get the drafts it gets without (here the shadow pool runs short under
    preemption), or its tokens, and those of every request on the shared generator, differ."""
    path, prompts = trained_hybrid_dir(), held_out_prompts(8, 6)
    params = [SamplingParams(max_tokens=20, temperature=t, seed=s, ignore_eos=True)
              for t, s in zip([1e-3, 1e-5, 2e-5, 5.0, 50.0, 0.3, 1.0, 1e-4],
                              [1, 2, None, None, 5, 6, 7, 8])]
    kw = dict(max_model_len=48, num_kv_blocks=14)
    runs = {}
    for ahead in (True, False):
        llm, log, counts = engine(path, ahead, **kw)
        ids = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
        runs[ahead] = (ids, log, llm.engine.scheduler.num_preemptions, counts)
    assert runs[True][:3] == runs[False][:3]
    assert runs[True][2] > 0 and runs[True][3]["ahead"] > 0
