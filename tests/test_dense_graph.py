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
