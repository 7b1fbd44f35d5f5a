"""Greedy generation on the real SmolLM2 model equals HF transformers' greedy, token for token."""

from __future__ import annotations

import pytest
import torch

from mtpserve import SamplingParams

MAX_NEW = 32
CHATS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Give me three tips for sleeping better.",
    "Explique la photosynthèse en une phrase.",
    "Translate 'good morning' into Spanish, German and Japanese.",
    "What is 17 * 23? Show your steps.",
]
RAW = [
    "The quick brown fox",
    "def quicksort(arr):\n",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 5, 8, 13,",
    "<html>\n  <body>\n",
    "The meaning of life is",
]


def _prompts(tokenizer) -> list[list[int]]:
    chat = [tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=True,
                                          add_generation_prompt=True, return_dict=False)
            for c in CHATS]
    return [list(c) for c in chat] + [tokenizer.encode(r) for r in RAW]


def hf_greedy(hf, ids: list[int], n: int, eos: int) -> tuple[list[int], list[float]]:
    """HF greedy continuation and, per step, the top-1 minus top-2 logit margin."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                          output_scores=True, return_dict_in_generate=True,
                          eos_token_id=eos, pad_token_id=eos)
    toks = out.sequences[0, len(ids):].tolist()
    margins = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    return toks, margins


@pytest.fixture(scope="module")
def references(hf_smollm2, smollm2_llm):
    tok = smollm2_llm.tokenizer
    prompts = _prompts(tok)
    return prompts, [hf_greedy(hf_smollm2, p, MAX_NEW, tok.eos_token_id) for p in prompts]


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def test_greedy_equals_hf_batched(smollm2_llm, references):
    """All 12 prompts in one batch (continuous batching, mixed lengths)."""
    prompts, refs = references
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    results = smollm2_llm.generate(prompts, params)
    for p, res, (ref, margins) in zip(prompts, results, refs):
        ours = res.outputs[0].token_ids
        i = _first_divergence(ours, ref)
        assert i is None, (f"prompt {smollm2_llm.tokenizer.decode(p)!r}: first divergence at "
                           f"token {i}, HF top-2 margin there {margins[min(i, len(margins) - 1)]:.3g}")
        assert res.outputs[0].finish_reason == ("stop" if len(ref) < MAX_NEW else "length")


def test_greedy_equals_hf_one_at_a_time(smollm2_llm, references):
    prompts, refs = references
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    for p, (ref, _) in list(zip(prompts, refs))[:4]:
        assert smollm2_llm.generate([p], params)[0].outputs[0].token_ids == ref


def test_prefill_logits_equal_hf(smollm2_llm, hf_smollm2):
    """Last-position logits after a prefill of a real prompt: max abs diff <= 1e-4."""
    from harness import logits_of_prompt

    ids = smollm2_llm.tokenizer.encode("Speculative decoding drafts tokens cheaply and verifies")
    ours = logits_of_prompt(smollm2_llm.engine, ids)
    with torch.no_grad():
        ref = hf_smollm2(torch.tensor([ids])).logits[0].float()
    assert (ours - ref).abs().max().item() <= 1e-4
