"""The CUDA-graph path of hybrid models, on the CPU: engine/hybrid_graph.py and spec/mtp_graph.py
build static batches (padded [B, Q] blocks, pad state slot, pad scratch row, per-token attention
layout) whose graphs the GPU replays. Here each "graph" is replayed by running the model's
forward over that static batch eagerly (harness_graphs.py): the scatter of a step into the
block, the masks that make padding leave the recurrent state alone, the gather of hidden states
and logits are all exercised. Greedy outputs (token ids exactly, logprobs within
1e-4) must equal plain eager decoding, with
steps of mixed query lengths (adaptive MTP drafts, n-gram misses) going through the graphs.
The tiny Qwen3-Next trained with its MTP layer (trained_hybrid.py) makes drafts get accepted."""

import pytest
import torch

from harness_hybrid import one_thread
from mtpserve import LLM, SamplingParams
from harness_graphs import eager_capture
from mtpserve.engine.cuda_graph import graph_sizes
from mtpserve.engine.hybrid_graph import HybridGraphRunner
from mtpserve.spec.mtp_graph import MTPGraphRunner
from trained_hybrid import held_out_prompts, progression, trained_hybrid_dir

PROMPTS = held_out_prompts(6, 6)
# a progression, then its start again: prompt lookup finds the continuation (accepted) until
# the copy runs out (then no drafts), at different steps for different requests
REPEATS = [progression(3 * i, 1 + i % 2, 14 + 2 * i) + progression(3 * i, 1 + i % 2, 3)
           for i in range(6)]
# logprobs too: the trained model's argmax is robust to small state errors, its logprobs are not
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, logprobs=2)
SEQS, LEN = 8, 64


def engine_with_graphs(path, **spec) -> tuple[LLM, dict, dict]:
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=LEN, num_kv_blocks=64,
              max_num_seqs=SEQS, **spec)
    k = spec.get("speculative_num_steps", 0) if spec else 0
    r = llm.engine.runner
    blocks = -(-LEN // r.block_size)
    mtp_spec = bool(spec) and spec["speculative_algorithm"] == "nextn"
    target = eager_capture(HybridGraphRunner(r, SEQS * (1 + k), k, SEQS, blocks, r.part_size,
                                             acceptance=mtp_spec))
    mtp = {"steps": 0, "mixed": 0}
    proposer = llm.engine.proposer
    if spec and spec["speculative_algorithm"] == "nextn":
        pr = proposer.runner
        mtp = eager_capture(MTPGraphRunner(pr, graph_sizes(SEQS * (1 + k)), SEQS, blocks,
                                           pr.part_size))
    return llm, target, mtp


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def path():
    return trained_hybrid_dir()


def assert_same(outs, refs) -> None:
    """Same token ids; every logprob (sampled and top 2) within 1e-4."""
    assert [o.token_ids for o in outs] == [r.token_ids for r in refs]
    for o, r in zip(outs, refs):
        for a, b in zip(o.logprobs, r.logprobs):
            assert abs(a.logprob - b.logprob) <= 1e-4
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            assert max(abs(x - y) for (_, x), (_, y) in zip(a.top, b.top)) <= 1e-4


@pytest.fixture(scope="module")
def plain(path) -> dict:
    """Plain eager greedy outputs of both prompt sets."""
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=LEN, num_kv_blocks=64,
              max_num_seqs=SEQS)
    return {name: [r.outputs[0] for r in llm.generate(prompts, GREEDY)]
            for name, prompts in (("progressions", PROMPTS), ("repeats", REPEATS))}


def test_decode_graphs_equal_eager(path, plain):
    llm, target, _ = engine_with_graphs(path)
    assert_same([r.outputs[0] for r in llm.generate(PROMPTS, GREEDY)], plain["progressions"])
    # every decode step of the 6 requests (19 after each prefill) replayed a graph
    assert target["steps"] >= 19 and target["mixed"] == 0


@pytest.mark.parametrize("spec", [
    dict(speculative_algorithm="nextn", speculative_adaptive=False),
    dict(speculative_algorithm="nextn", speculative_adaptive=True),
    dict(speculative_algorithm="ngram", speculative_adaptive=False),
], ids=["mtp-fixed", "mtp-adaptive", "ngram"])
def test_verify_graphs_equal_eager(path, plain, spec):
    llm, target, mtp = engine_with_graphs(path, speculative_num_steps=3, **spec)
    name = "repeats" if spec["speculative_algorithm"] == "ngram" else "progressions"
    prompts = REPEATS if name == "repeats" else PROMPTS
    assert_same([r.outputs[0] for r in llm.generate(prompts, GREEDY)], plain[name])
    assert_same([llm.generate([p], GREEDY)[0].outputs[0] for p in prompts], plain[name])
    m = llm.engine.spec_metrics
    assert m.num_accepted_tokens > 0 and target["steps"] > 0
    if spec["speculative_algorithm"] == "nextn":
        assert mtp["steps"] > 0
    if spec["speculative_algorithm"] == "ngram" or spec["speculative_adaptive"]:
        # sequences drafting different numbers of tokens in one step, padded into the block
        assert target["mixed"] > 0


def test_greedy_verify_steps_take_the_acceptance_their_graph_decided(path, plain):
    """One request at a time (a full [1, 4] block every verify step): the verify graph's own
    argmax and acceptance (hybrid_graph.py ``_forward``) serve every all-greedy verify step,
    and the acceptance the host then finds equals it at every row (a row where they differ
    would fall back to the usual observe: ``_observed_ahead``'s rest)."""
    import mtpserve.spec.mtp as mtp_module

    llm, _, _ = engine_with_graphs(path, speculative_num_steps=3,
                                   speculative_algorithm="nextn", speculative_adaptive=False)
    proposer = llm.engine.proposer
    graph_decided, fell_back, rows_ahead = [], [], [0]
    real_step, real_observed = mtp_module.AheadStep, proposer._observed_ahead

    def step(targets, accepted, seqs, starts, both=None):
        graph_decided.append(both is not None)
        return real_step(targets, accepted, seqs, starts, both)

    def observed(items):
        rest = real_observed(items)
        rows_ahead[0] += len(items) - len(rest)
        fell_back.extend(rest)
        return rest

    mtp_module.AheadStep, proposer._observed_ahead = step, observed
    try:
        outs = [llm.generate([p], GREEDY)[0].outputs[0] for p in PROMPTS]
    finally:
        mtp_module.AheadStep = real_step
    assert_same(outs, plain["progressions"])
    assert len(graph_decided) > 20 and all(graph_decided)
    # every step's row is finished ahead but each request's last (it ends there: not observed)
    assert fell_back == [] and rows_ahead[0] == len(graph_decided) - len(PROMPTS)
