"""Engine mechanics on the real SmolLM2 model: stops, limits, seeds, n, batching, preemption,
prefix caching and chunked prefill, each checked against a plain run of the same request."""

from __future__ import annotations

import pytest
import torch

from mtpserve import LLM, SamplingParams
from mtpserve.sampling_params import SamplingParamsError

GREEDY = dict(temperature=0.0)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def chat_ids(tok, text):
    return list(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                        add_generation_prompt=True, return_dict=False))


@pytest.fixture(scope="module")
def llm(smollm2_llm):
    return smollm2_llm


@pytest.fixture(scope="module")
def story_ids(llm):
    return chat_ids(llm.tokenizer, "Tell me a story about a cat and a dog who became friends.")


def run(llm, prompt, **kw):
    return llm.generate([prompt], SamplingParams(**kw))[0].outputs[0]


def test_stop_string_spanning_two_tokens(llm):
    tok = llm.tokenizer
    full = llm.chat(QUESTION, SamplingParams(max_tokens=20, **GREEDY)).outputs[0]
    pieces = [tok.decode([t]) for t in full.token_ids]
    assert pieces[3:5] == [" France", " is"]  # the known greedy answer of the real model
    stop = "ce is"                            # starts inside " France", ends inside " is"
    out = llm.chat(QUESTION, SamplingParams(max_tokens=20, stop=[stop], **GREEDY)).outputs[0]
    assert out.text == full.text[: full.text.index(stop)] == "The capital of Fran"
    assert out.token_ids == full.token_ids[:5]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    kept = llm.chat(QUESTION, SamplingParams(max_tokens=20, stop=[stop], **GREEDY,
                                             include_stop_str_in_output=True)).outputs[0]
    assert kept.text == "The capital of France is"


def test_eos_and_stop_token_ids(llm):
    full = llm.chat(QUESTION, SamplingParams(max_tokens=20, **GREEDY)).outputs[0]
    assert full.token_ids[-1] == llm.engine.eos_token_ids[0] and full.finish_reason == "stop"
    assert full.stop_reason is None and full.text == "The capital of France is Paris."
    paris = full.token_ids[5]
    out = llm.chat(QUESTION, SamplingParams(max_tokens=20, stop_token_ids=[paris],
                                            **GREEDY)).outputs[0]
    assert out.token_ids == full.token_ids[:6]
    assert (out.finish_reason, out.stop_reason) == ("stop", paris)
    assert out.text == "The capital of France is"
    ignored = llm.chat(QUESTION, SamplingParams(max_tokens=12, ignore_eos=True,
                                                **GREEDY)).outputs[0]
    assert len(ignored.token_ids) == 12 and ignored.finish_reason == "length"
    assert ignored.token_ids[: len(full.token_ids)] == full.token_ids


def test_max_tokens_and_max_model_len(llm, story_ids):
    out = run(llm, story_ids, max_tokens=7, **GREEDY)
    assert len(out.token_ids) == 7 and out.finish_reason == "length"
    small = LLM(None, dtype="float32", max_model_len=len(story_ids) + 5, num_kv_blocks=64)
    out2 = run(small, story_ids, max_tokens=None, **GREEDY)
    assert out2.token_ids == run(llm, story_ids, max_tokens=5, **GREEDY).token_ids
    assert out2.finish_reason == "length"


def test_one_token_request_finishes_right_after_prefill(llm, story_ids):
    two = run(llm, story_ids, max_tokens=2, **GREEDY)
    one = run(llm, story_ids, max_tokens=1, **GREEDY)
    assert one.token_ids == two.token_ids[:1] and one.finish_reason == "length"
    assert one.text == llm.tokenizer.decode(one.token_ids)


def test_incremental_text_equals_decode(llm, story_ids):
    out = run(llm, story_ids, max_tokens=40, ignore_eos=True, **GREEDY)
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_seed_reproducible_alone_and_in_a_batch(llm, story_ids):
    p = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=1234)
    alone = llm.generate([story_ids], p)[0].outputs[0].token_ids
    other = SamplingParams(max_tokens=30, temperature=1.0)
    batch = llm.generate([chat_ids(llm.tokenizer, "hi"), story_ids, story_ids[:-3]],
                         [other, p, other])
    assert batch[1].outputs[0].token_ids == alone
    again = llm.generate([story_ids], SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95,
                                                     seed=1235))[0].outputs[0].token_ids
    assert again != alone


def test_n_completions_are_seeded_children(llm, story_ids):
    p = SamplingParams(n=3, max_tokens=16, temperature=1.0, seed=7)
    res = llm.generate([story_ids], p)[0]
    assert [o.index for o in res.outputs] == [0, 1, 2]
    for i, o in enumerate(res.outputs):
        solo = run(llm, story_ids, max_tokens=16, temperature=1.0, seed=7 + i)
        assert o.token_ids == solo.token_ids
    assert len({tuple(o.token_ids) for o in res.outputs}) == 3


def test_logprobs_equal_a_fresh_prefill(llm, story_ids):
    """Logprobs recorded while decoding equal log_softmax of one prefill over the same text."""
    from harness import logits_of_prompt

    out = run(llm, story_ids, max_tokens=12, logprobs=3, **GREEDY)
    logits = logits_of_prompt(llm.engine, story_ids + out.token_ids)
    ref = torch.log_softmax(logits[len(story_ids) - 1:-1], dim=-1)
    for i, lp in enumerate(out.logprobs):
        assert lp.token_id == out.token_ids[i]
        assert abs(lp.logprob - ref[i, lp.token_id].item()) <= 1e-4
        top = ref[i].topk(3)
        assert [t for t, _ in lp.top] == top.indices.tolist()


def test_preemption_loses_nothing(llm, story_ids):
    """A KV pool too small for all requests at once: requests are preempted and recomputed, and
    every output equals the request run without preemption: the same batch on the module's
    engine, whose pool holds them all. (Not each request alone on the small pool: 160 decode
    steps of one sequence, each reading all the weights, took 17 of this test's 29 s; one
    batch of four takes 40 steps. Batched greedy equals one-at-a-time greedy:
    test_generate_real.py.)"""
    tight = LLM(None, dtype="float32", max_model_len=256, num_kv_blocks=16, block_size=16,
                enable_prefix_caching=False)
    prompts = [story_ids, story_ids[:-4], story_ids[:-8], story_ids[:-12]]
    p = SamplingParams(max_tokens=40, ignore_eos=True, **GREEDY)
    before = llm.engine.scheduler.num_preemptions
    unpreempted = [r.outputs[0].token_ids for r in llm.generate(prompts, p)]
    assert llm.engine.scheduler.num_preemptions == before   # the reference was not preempted
    before = tight.engine.scheduler.num_preemptions
    together = [r.outputs[0].token_ids for r in tight.generate(prompts, p)]
    assert tight.engine.scheduler.num_preemptions > before
    assert together == unpreempted
    assert tight.engine.block_manager.num_free_blocks == 16
    # async scheduling (engine/overlap.py): preempted while a step is in flight, same outputs
    tight.engine.async_scheduling, before = True, tight.engine.scheduler.num_preemptions
    overlapped = [r.outputs[0].token_ids for r in tight.generate(prompts, p)]
    assert tight.engine.scheduler.num_preemptions > before
    assert overlapped == unpreempted and tight.engine._pending is None
    assert tight.engine.block_manager.num_free_blocks == 16


def test_prefix_cache_hit_and_chunked_prefill(story_ids):
    small_steps = LLM(None, dtype="float32", max_model_len=512, num_kv_blocks=128,
                      block_size=16, max_num_batched_tokens=24)
    p = SamplingParams(max_tokens=16, **GREEDY)
    first = small_steps.generate([story_ids], p)[0]
    second = small_steps.generate([story_ids], p)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == (len(story_ids) - 1) // 16 * 16
    plain = LLM(None, dtype="float32", max_model_len=512, num_kv_blocks=128,
                enable_prefix_caching=False)
    ref = plain.generate([story_ids], p)[0].outputs[0].token_ids
    assert first.outputs[0].token_ids == second.outputs[0].token_ids == ref
    small_steps.engine.async_scheduling = True   # chunks that sample nothing, overlapped
    third = small_steps.generate([story_ids[:-1]], p)[0]
    assert third.num_cached_tokens == (len(story_ids) - 2) // 16 * 16
    assert third.outputs[0].token_ids == plain.generate([story_ids[:-1]], p)[0].outputs[0].token_ids


@pytest.mark.parametrize("prompt, params, param", [
    ([], dict(), "prompt"),
    ([5, 49152], dict(), "prompt"),
    ([5, -1], dict(), "prompt"),
    ([5] * 2048, dict(), "prompt"),
    ([5] * 2000, dict(max_tokens=49), "max_tokens"),
    ([5], dict(max_tokens=0), "max_tokens"),
    ([5], dict(temperature=-0.5), "temperature"),
    ([5], dict(top_p=0.0), "top_p"),
    ([5], dict(n=0), "n"),
])
def test_bad_requests_raise_and_leave_the_engine_working(llm, prompt, params, param):
    with pytest.raises(SamplingParamsError) as e:
        llm.generate([prompt], SamplingParams(**params))
    assert e.value.param == param
    assert not llm.engine.has_unfinished_requests()
    assert run(llm, [1, 2, 3], max_tokens=2, **GREEDY).finish_reason == "length"
