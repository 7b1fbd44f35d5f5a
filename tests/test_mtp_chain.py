"""The greedy MTP draft chain (spec/mtp_chain.py, spec/mtp_chain_graph.py) on the CPU.

Two engines over the same checkpoint and requests, one drafting through the chain, one through
the step-by-step loop it replaces (``MTPProposer.use_chain = False``), with a budget stand-in
that gives every request a different number of drafts (0..k) at every step: the drafts of every
step must be the same token ids, and the generated tokens those of plain decoding. A random MTP
layer (any wrong position, KV slot or hidden state changes its argmax; nothing is accepted) and
the tiny trained one (drafts get accepted, so ``observe`` runs over several positions). The
graph runner's padding (rows up to the captured size, K/V to the pad slot, shared block table)
is exercised with "graphs" replayed eagerly over their static buffers."""

from __future__ import annotations

import pytest
import torch

from harness_hybrid import one_thread
from hybrid_checkpoint import random_mtp_checkpoint
from harness_mtp_chain import mtp_llm
from mtpserve import LLM, SamplingParams
from mtpserve.spec.mtp_chain import ChainRow, plan_chain
from mtpserve.spec.mtp_chain_graph import ChainGraphs
from trained_hybrid import held_out_prompts, trained_hybrid_dir

K = 3
GREEDY = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
KW = dict(dtype="float32", max_model_len=128, num_kv_blocks=128, block_size=4, max_num_seqs=8)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def random_ckpt(tmp_path_factory):
    return random_mtp_checkpoint(tmp_path_factory.mktemp("chain") / "tiny")[0]


def random_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(2, 256, (n,), generator=g).tolist() for n in (5, 11, 3, 17, 8, 6)]


@pytest.fixture(scope="module", params=["random", "trained"])
def case(request, random_ckpt):
    """(checkpoint, prompts, plain greedy token ids)."""
    if request.param == "random":
        path, prompts = random_ckpt, random_prompts()
    else:
        path, prompts = trained_hybrid_dir(), held_out_prompts(6, 6)
    plain = LLM(str(path), **KW).generate(prompts, GREEDY)
    return path, prompts, [r.outputs[0].token_ids for r in plain]


def run_both(path, prompts, **kw):
    """(chain engine, its log, its token ids), (loop engine, its log, its token ids)."""
    out = {}
    for use_chain in (True, False):
        llm, log = mtp_llm(path, use_chain, K, **{**KW, **kw})
        ids = [r.outputs[0].token_ids for r in llm.generate(prompts, GREEDY)]
        out[use_chain] = (llm, log, ids)
    return out[True], out[False]


def test_plan_lays_out_real_dead_and_padding_steps():
    # row 0: L = 7, budget 3 -> chained positions 6, 7 in its block 9 (block size 4);
    # row 1: L = 6, budget 1 -> both steps dead at its last real position 4 (L - 2);
    # rows 2, 3: padding. Tables cut to the blocks the positions need (2).
    rows = [ChainRow([5, 9, 2], 7, 3), ChainRow([4, 1], 6, 1)]
    plan = plan_chain(rows, steps=3, padded=4, block_size=4, pad_slot=100)
    pos = [6, 4, 0, 0, 7, 4, 0, 0]
    assert plan.i64 == pos + [38, 100, 100, 100, 39, 100, 100, 100] + [p + 1 for p in pos]
    assert plan.i32 == [0, 1, 0, 0] + [p + 1 for p in pos]
    assert (plan.tables, plan.width, plan.rows, plan.padded) == ([5, 9, 4, 1], 2, 2, 4)


def test_chain_drafts_equal_the_step_loop(case):
    path, prompts, plain = case
    (llm, chain_log, chain_ids), (_, loop_log, loop_ids) = run_both(path, prompts)
    assert chain_ids == loop_ids == plain
    assert [calls for calls, _ in chain_log] == [calls for calls, _ in loop_log]
    assert all(used for _, used in chain_log) and not any(used for _, used in loop_log)
    # the budgets really differ within a step, and some rows run dead steps
    budgets = [sorted({len(d) for _, _, d, _ in calls}) for calls, _ in chain_log]
    assert sum(len(b) >= 3 for b in budgets) >= 3
    assert any(len(d) == K for calls, _ in chain_log for _, _, d, _ in calls)
    assert all(len(d) == b for calls, _ in chain_log for _, b, d, _ in calls)


def sampled_run(ckpt, sampled_drafts: bool, monkeypatch):
    """Two greedy requests and one sampling one (seeded) through an MTP engine; returns the
    outputs, the draft log and the q each verify got for the sampling request (None: one-hot)."""
    import mtpserve.engine.engine as engine_mod

    llm, log = mtp_llm(ckpt, True, K, **KW)
    llm.engine.proposer.sampled_drafts = sampled_drafts
    qs, verify = [], engine_mod.verify

    def logged(sampler, logits, items, argmax=None):
        qs.extend(it.draft_probs for it in items if not it.rows[0].params.greedy and it.drafts)
        return verify(sampler, logits, items, argmax)

    monkeypatch.setattr(engine_mod, "verify", logged)
    params = [GREEDY, GREEDY, SamplingParams(max_tokens=12, temperature=0.8, seed=5)]
    return llm.generate(random_prompts()[:3], params), log, qs


def test_a_sampling_request_drafts_the_mtp_argmax_through_the_chain(random_ckpt, monkeypatch):
    """By default a sampling request drafts like a greedy one (the chain; verify gets a one-hot
    q, None); with ``sampled_drafts`` it keeps the step loop and verify gets the loop's q."""
    plain = LLM(str(random_ckpt), **KW).generate(random_prompts()[:3], GREEDY)
    outs, log, qs = sampled_run(random_ckpt, False, monkeypatch)
    assert [o.outputs[0].token_ids for o in outs[:2]] == [r.outputs[0].token_ids
                                                         for r in plain[:2]]
    with_sampler = [used for calls, used in log if not all(g for *_, g in calls)]
    assert with_sampler and all(with_sampler)     # every step with it drafted through the chain
    assert qs and all(q is None for q in qs)
    again, _, _ = sampled_run(random_ckpt, False, monkeypatch)   # seeded: the same tokens
    assert again[2].outputs[0].token_ids == outs[2].outputs[0].token_ids

    outs, log, qs = sampled_run(random_ckpt, True, monkeypatch)
    with_sampler = [used for calls, used in log if not all(g for *_, g in calls)]
    assert with_sampler and not any(with_sampler)
    assert any(used for _, used in log)   # once it finished, the greedy ones chain
    assert qs and all(q is not None and q.shape[0] >= 1 for q in qs)


class EagerChainReplay:
    """Stands in for a captured chain graph: runs the chain over the static buffers."""

    def __init__(self, graphs: ChainGraphs, g, counts: dict):
        self.graphs, self.g, self.counts = graphs, g, counts

    def replay(self):
        self.counts[self.g.hidden.shape[0]] = self.counts.get(self.g.hidden.shape[0], 0) + 1
        self.g.drafts.copy_(self.graphs.forward(self.g))


@torch.inference_mode()
def eager_chain_graphs(llm: LLM, max_seqs: int) -> dict:
    """Give the engine's chain ChainGraphs whose replays run eagerly; returns replays by
    padded row count."""
    proposer = llm.engine.proposer
    r = proposer.runner
    graphs = ChainGraphs(proposer.chain, max_seqs, -(-r.max_model_len // r.block_size), K)
    counts: dict[int, int] = {}
    for key in graphs.keys():
        g = graphs.static(key)
        g.drafts = graphs.forward(g).clone()
        g.graph = EagerChainReplay(graphs, g, counts)
        graphs.graphs[key] = g
    proposer.chain.graphs = graphs
    return counts


def test_padded_graph_layout_drafts_equal_the_step_loop(random_ckpt):
    prompts = random_prompts()
    # requests finish one after another: every batch size from 6 down to 1
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
              for n in (4, 7, 10, 13, 16, 20)]
    loop, loop_log = mtp_llm(random_ckpt, False, K, **KW)
    loop_ids = [r.outputs[0].token_ids for r in loop.generate(prompts, params)]
    llm, log = mtp_llm(random_ckpt, True, K, **KW)
    counts = eager_chain_graphs(llm, max_seqs=4)   # captured 1, 2, 4 rows: 5, 6 rows run eagerly
    ids = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    assert ids == loop_ids
    assert [calls for calls, _ in log] == [calls for calls, _ in loop_log]
    assert counts.get(4, 0) > 0 and counts.get(2, 0) > 0 and counts.get(1, 0) > 0
    assert any(rows > 4 for _, rows in log)   # and larger batches eagerly
    # steps of 3 drafting rows replayed the 4-row graph (one padding row)
    assert 3 in [rows for _, rows in log]


@pytest.mark.parametrize("kw", [dict(max_num_batched_tokens=5),
                                dict(max_model_len=32, num_kv_blocks=10)],
                         ids=["drafts-cut-by-the-token-budget", "preemption"])
def test_drafts_kept_on_the_device_under_cut_drafts_and_preemption(kw):
    """Chain drafts reach the verify batch from the device (spec/pending_drafts.py) also when
    the scheduler verifies only a prefix of them, or preempts drafted sequences: on the trained
    model, chain and loop engines propose the same drafts, accept the same tokens step by step,
    and both emit plain decoding's tokens."""
    path, prompts = trained_hybrid_dir(), held_out_prompts(6, 6)
    plain = [r.outputs[0].token_ids
             for r in LLM(str(path), **{**KW, **kw}).generate(prompts, GREEDY)]
    (llm, log, ids), (loop, loop_log, loop_ids) = run_both(path, prompts, **kw)
    assert ids == plain and loop_ids == plain
    assert [c for c, _ in log] == [c for c, _ in loop_log]
    m, lm = llm.engine.spec_metrics, loop.engine.spec_metrics
    assert (m.num_draft_tokens, m.num_accepted_tokens, list(m.accepted_per_step)) == \
        (lm.num_draft_tokens, lm.num_accepted_tokens, list(lm.accepted_per_step))
    assert m.num_accepted_tokens > 0
    proposed = sum(len(d) for calls, _ in log for _, _, d, _ in calls)
    if "num_kv_blocks" in kw:
        assert llm.engine.scheduler.num_preemptions > 0
    else:   # some drafts were proposed but never scheduled
        assert proposed > m.num_draft_tokens
