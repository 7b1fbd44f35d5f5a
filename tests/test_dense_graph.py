"""The CUDA-graph path of dense models on the CPU (harness_graphs.py: each graph's static batch is
run eagerly in place of a replay), with the real SmolLM2: decode and verify steps padded to the
captured token counts, the draft model's own graphs (spec/draft_model.py), sequences with and
without drafts in one step. Greedy token ids equal plain decoding, logprobs within 1e-4."""

import pytest

from harness_graphs import eager_capture
from mtpserve import LLM, SamplingParams
from mtpserve.bench.prompts import PROMPT_SETS
from mtpserve.engine.cuda_graph import CudaGraphRunner, graph_sizes

SEQS, K = 4, 3
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, logprobs=1)
TEXTS = [PROMPT_SETS["code-edit"][0], PROMPT_SETS["chat"][0], PROMPT_SETS["repetitive"][0],
         PROMPT_SETS["multilingual"][0]]


def engine(**spec) -> LLM:
    return LLM(None, dtype="float32", device="cpu", max_model_len=1024, num_kv_blocks=256,
               max_num_seqs=SEQS, **spec)


def with_graphs(llm: LLM) -> tuple[dict, dict]:
    """Install eagerly replayed graphs on the target (and a draft model's) runner."""
    k = llm.engine.config.speculative.num_steps if llm.engine.config.speculative else 0
    counts = []
    for r in [llm.engine.runner] + ([llm.engine.proposer.runner]
                                    if hasattr(llm.engine.proposer, "runner") else []):
        counts.append(eager_capture(CudaGraphRunner(
            r, graph_sizes(SEQS * (1 + k)), SEQS, -(-r.max_model_len // r.block_size),
            r.part_size)))
    return counts[0], counts[1] if len(counts) > 1 else {}


@pytest.fixture(scope="module")
def prompts(smollm2_llm):
    tok = smollm2_llm.tokenizer
    return [list(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=True,
                                         add_generation_prompt=True, return_dict=False))
            for t in TEXTS]


@pytest.fixture(scope="module")
def plain(prompts):
    return [r.outputs[0] for r in engine().generate(prompts, GREEDY)]


def assert_same(outs, refs) -> None:
    assert [o.token_ids for o in outs] == [r.token_ids for r in refs]
    for o, r in zip(outs, refs):
        assert max(abs(a.logprob - b.logprob) for a, b in zip(o.logprobs, r.logprobs)) <= 1e-4


def test_decode_graphs_equal_eager(prompts, plain):
    llm = engine()
    target, _ = with_graphs(llm)
    assert_same([r.outputs[0] for r in llm.generate(prompts, GREEDY)], plain)
    assert target["steps"] >= GREEDY.max_tokens - 1


@pytest.mark.parametrize("spec", [
    dict(speculative_algorithm="ngram"),
    dict(speculative_algorithm="draft", speculative_draft_model_path="self"),
], ids=["ngram", "draft-self"])
def test_verify_and_draft_graphs_equal_eager(prompts, plain, spec):
    llm = engine(speculative_num_steps=K, speculative_adaptive=False, **spec)
    target, draft = with_graphs(llm)
    assert_same([r.outputs[0] for r in llm.generate(prompts, GREEDY)], plain)
    assert llm.engine.spec_metrics.num_accepted_tokens > 0
    assert target["steps"] > 0
    if spec["speculative_algorithm"] == "draft":
        # the draft model's decode and catch-up steps replayed graphs of its own
        assert draft["steps"] > 0
    else:
        # some requests drafted while others found no match, in the same step
        assert target["mixed"] > 0


def test_a_request_whose_prompt_is_cached_joins_the_decodes_in_a_graph(prompts, plain):
    """Plain decoding captures steps of up to SEQS - 1 decodes beside one prefill of up to 16
    tokens (``graph_token_limit(prefill_tail=True)``): the step that admits a request whose
    prompt is cached but for its last partial block replays a graph, where graphs capped at
    SEQS tokens ran it eagerly (at 64 requests with repeating prompts on the H100, plain
    decoding ran at 14.5-20.7k tok/s beside the n-gram engine's plain steps at 25-38k: likely
    this, session 39). Greedy outputs equal the eager engine's."""
    llm = engine()
    eng, r = llm.engine, llm.engine.runner
    assert (r.graph_token_limit(), r.graph_token_limit(prefill_tail=True)) == (SEQS, SEQS + 15)
    counts = eager_capture(CudaGraphRunner(
        r, graph_sizes(r.graph_token_limit(prefill_tail=True)), SEQS,
        -(-r.max_model_len // r.block_size), r.part_size))
    got = {}

    def step():
        for o in eng.step():
            got[o.request_id] = got.get(o.request_id, []) + list(o.new_token_ids)
    eng.add_request("cached", prompts[0], GREEDY)   # its blocks stay cached once it ends
    while eng.has_unfinished_requests():
        step()
    for i in (1, 2, 3):
        eng.add_request(f"r{i}", prompts[i], GREEDY)
    while any(s.in_prefill for s in eng.scheduler.running) or eng.scheduler.waiting:
        step()
    before = dict(counts)
    eng.add_request("again", prompts[0], GREEDY)
    step()
    seq = eng.seqs["again"]
    assert seq.num_cached_tokens == len(prompts[0]) - 1 - (len(prompts[0]) - 1) % 16
    assert (counts["steps"] - before["steps"], counts["mixed"] - before["mixed"]) == (1, 1)
    while eng.has_unfinished_requests():
        step()
    assert [got[k] for k in ("cached", "r1", "r2", "r3", "again")] == [
        p.token_ids for p in (plain[0], plain[1], plain[2], plain[3], plain[0])]
