"""Speculative decoding on the real SmolLM2 model (float32, CPU): lossless against no speculation."""

from __future__ import annotations

import pytest
import torch

from mtpserve import LLM, SamplingParams
from mtpserve.bench.prompts import PROMPT_SETS

K = 3
MAX_NEW = 32
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
ALL_PROMPTS = [p for ps in PROMPT_SETS.values() for p in ps]
# 12 of the 26 built-in prompts, every set: chat 0 3 5, code 8 11, code-edit 13 16,
# summarization 17, repetitive 19 21, multilingual 22 25 (all 26 took 75 s with n-gram and
# 111 s with self-drafting on a 2-core box run serially beside other work, session 17)
CONCURRENT = [0, 3, 5, 8, 11, 13, 16, 17, 19, 21, 22, 25]
# what the tests below compare against the engine without speculation
REFERENCE = sorted(set(CONCURRENT) | set(range(8)) | {9, 20})


def spec_llm(algo, **kw):
    # self-drafting costs a whole target step per draft: the adaptive policy would never draft
    extra = {"speculative_draft_model_path": "self",
             "speculative_adaptive": False} if algo == "draft" else {}
    return LLM(None, dtype="float32", max_model_len=2048, num_kv_blocks=256, max_num_seqs=8,
               speculative_algorithm=algo, speculative_num_steps=K, **extra, **kw)


def chat(tok, text):
    return list(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                        add_generation_prompt=True, return_dict=False))


@pytest.fixture(scope="module")
def prompts(smollm2_llm):
    assert len(ALL_PROMPTS) >= 20
    return [chat(smollm2_llm.tokenizer, p) for p in ALL_PROMPTS]


@pytest.fixture(scope="module")
def reference(smollm2_llm, prompts):
    """Prompt index -> the engine's greedy output without speculation, for REFERENCE."""
    outs = smollm2_llm.generate([prompts[i] for i in REFERENCE], GREEDY)
    return {i: r.outputs[0] for i, r in zip(REFERENCE, outs)}


@pytest.fixture(scope="module", params=["ngram", "draft"])
def spec(request):
    return request.param, spec_llm(request.param)


def assert_same(engine, prompt, ours, ref):
    """Equal token ids; else fail with the target's top-2 logit margin at the divergence."""
    if ours == ref:
        return
    from harness import logits_of_prompt

    i = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    logits = logits_of_prompt(engine, prompt + ref[:i + 1])[len(prompt) + i - 1]
    top = logits.topk(2).values
    pytest.fail(f"divergence at output token {i}: ours {ours[i:i + 3]} vs {ref[i:i + 3]}; "
                f"target top-2 margin {float(top[0] - top[1]):.3g}")


def test_greedy_equal_with_8_concurrent(spec, prompts, reference, smollm2_llm):
    algo, llm = spec
    results = llm.generate([prompts[i] for i in CONCURRENT], GREEDY)
    for i, res in zip(CONCURRENT, results):
        p, ref = prompts[i], reference[i]
        assert_same(smollm2_llm.engine, p, res.outputs[0].token_ids, ref.token_ids)
        assert res.outputs[0].text == ref.text
        assert res.outputs[0].finish_reason == ref.finish_reason
    stats = llm.engine.spec_metrics
    assert stats.num_verify_steps > 0 and stats.num_accepted_tokens > 0


def test_greedy_equal_one_at_a_time(spec, prompts, reference, smollm2_llm):
    _, llm = spec
    for i in (0, 9, 13, 19, 22):  # chat, code, code-edit, repetitive, multilingual
        out = llm.generate([prompts[i]], GREEDY)[0].outputs[0]
        assert_same(smollm2_llm.engine, prompts[i], out.token_ids, reference[i].token_ids)


def test_self_draft_accepts_everything(prompts):
    """Draft = target, greedy: acceptance rate exactly 1.0 and acceptance length exactly k + 1.
    max_tokens = 1 + 5 (k + 1) lets every verify step carry all k drafts."""
    llm = spec_llm("draft")
    p = SamplingParams(max_tokens=1 + 5 * (K + 1), temperature=0.0, ignore_eos=True)
    for res in llm.generate(prompts[:6], p):
        s = res.outputs[0].spec
        assert (s.num_verify_steps, s.num_draft_tokens) == (5, 5 * K)
        assert s.acceptance_rate == 1.0 and s.acceptance_length == K + 1


def test_forced_reject_accepts_nothing_and_loses_nothing(prompts, reference):
    llm = spec_llm("forced_reject")
    results = llm.generate(prompts[:8], GREEDY)
    vocab = llm.engine.model_config.vocab_size
    for res, ref in zip(results, [reference[i] for i in range(8)]):
        out = res.outputs[0]
        assert out.token_ids == ref.token_ids and out.text == ref.text
        assert all(0 <= t < vocab for t in out.token_ids)
        assert out.spec.num_accepted_tokens == 0 and out.spec.acceptance_length == 1.0
        # decode step s verified min(k, room left before max_tokens) drafts; none when no room
        drafts = [min(K, MAX_NEW - 2 - s) for s in range(len(out.token_ids) - 1)]
        assert out.spec.num_verify_steps == sum(d > 0 for d in drafts)
        assert out.spec.num_draft_tokens == sum(d for d in drafts if d > 0)


def test_logprobs_equal_with_and_without_speculation(smollm2_llm, prompts):
    p = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)
    idx = [19, 13, 0]
    ref = [r.outputs[0] for r in smollm2_llm.generate([prompts[i] for i in idx], p)]
    ours = [r.outputs[0] for r in spec_llm("ngram").generate([prompts[i] for i in idx], p)]
    for a, b in zip(ours, ref):
        assert a.token_ids == b.token_ids
        for la, lb in zip(a.logprobs, b.logprobs):
            assert la.token_id == lb.token_id
            assert abs(la.logprob - lb.logprob) <= 1e-4
            assert [t for t, _ in la.top] == [t for t, _ in lb.top]
            assert max(abs(x - y) for (_, x), (_, y) in zip(la.top, lb.top)) <= 1e-4


def test_zero_draft_steps_mixed_with_multi_accept_steps(prompts, reference):
    """n-gram drafts only where a suffix repeats: some steps of a request carry no drafts, others
    accept several, across a batch; the output is still exactly the non-speculative one."""
    llm = spec_llm("ngram")
    idx = [19, 20, 0, 13]  # repetitive, repetitive, chat, code-edit
    results = llm.generate([prompts[i] for i in idx], GREEDY)
    for i, res in zip(idx, results):
        out = res.outputs[0]
        assert out.token_ids == reference[i].token_ids
        decode_steps = len(out.token_ids) - 1 - out.spec.num_accepted_tokens
        assert out.spec.num_verify_steps < decode_steps  # at least one step drafted nothing
    hist = llm.engine.spec_metrics.accepted_per_step
    assert hist[0] > 0 and sum(hist[2:]) > 0


def test_seeded_sampling_with_speculation_is_reproducible(prompts):
    p = SamplingParams(max_tokens=24, temperature=0.8, top_k=40, seed=77)
    a = spec_llm("ngram").generate([prompts[19]], p)[0].outputs[0].token_ids
    b = spec_llm("ngram").generate([prompts[19], prompts[1]], [p, GREEDY])[0].outputs[0].token_ids
    assert a == b


def test_stops_inside_accepted_blocks(smollm2_llm, prompts):
    """forced-accept accepts whole blocks; stop string, stop token, EOS and max_tokens that fall
    inside a block cut the output exactly where the plain run cuts it."""
    llm = spec_llm("forced_accept")
    prompt = prompts[0]   # "What is the capital of France?" -> "The capital of France is Paris."
    full = smollm2_llm.generate([prompt], SamplingParams(max_tokens=20, temperature=0.0,
                                                         logprobs=1))[0].outputs[0]
    cases = [dict(stop=["ce is"]), dict(stop_token_ids=[full.token_ids[5]]), dict(),
             dict(max_tokens=6), dict(max_tokens=7, ignore_eos=True)]
    for kw in cases:
        p = SamplingParams(**{"max_tokens": 20, "temperature": 0.0, "logprobs": 1, **kw})
        ref = smollm2_llm.generate([prompt], p)[0].outputs[0]
        out = llm.generate([prompt], p)[0].outputs[0]
        assert (out.text, out.token_ids, out.finish_reason, out.stop_reason) == \
            (ref.text, ref.token_ids, ref.finish_reason, ref.stop_reason), kw
        assert [lp.token_id for lp in out.logprobs] == out.token_ids
        assert max(abs(a.logprob - b.logprob) for a, b in zip(out.logprobs, ref.logprobs)) <= 1e-4
        assert out.spec.num_accepted_tokens == out.spec.num_draft_tokens  # all accepted


def test_max_model_len_reached_while_drafting(prompts):
    prompt = prompts[19]
    limit = len(prompt) + 10
    base = LLM(None, dtype="float32", max_model_len=limit, num_kv_blocks=64)
    ref = base.generate([prompt], SamplingParams(max_tokens=None, temperature=0.0,
                                                 ignore_eos=True))[0].outputs[0]
    llm = LLM(None, dtype="float32", max_model_len=limit, num_kv_blocks=64,
              speculative_algorithm="forced_accept", speculative_num_steps=4)
    out = llm.generate([prompt], SamplingParams(max_tokens=None, temperature=0.0,
                                                ignore_eos=True))[0].outputs[0]
    assert out.token_ids == ref.token_ids and len(out.token_ids) == 10
    assert out.finish_reason == "length"
