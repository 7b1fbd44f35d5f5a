"""MTP drafting with a TRAINED MTP layer (issue 4): random MTP weights accept almost nothing, so a
tiny Qwen3-Next trained jointly with its MTP layer on arithmetic progressions (trained_hybrid.py,
built once and cached) shows the draft path is wired right. Greedy, 3 steps, held-out prompts, all
in one batch and one at a time: outputs equal plain decoding, acceptance length >= 1.5, and with
the adaptive policy off every request's verify counts equal a replay of the same speculative
decoding written with the HF training modules (no cache, recomputed from scratch each step)."""

import pytest
import torch

from harness_hybrid import one_thread
from mtpserve import LLM, SamplingParams
from trained_hybrid import (TRAIN, accuracies, held_out_prompts, load_trained, replay_spec,
                            sample_batch, trained_hybrid_dir)

K, MAX_TOKENS = 3, 24
PROMPTS = held_out_prompts(8, 6)
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="session")
def trained_dir():
    """The cached trained checkpoint directory (trains on first use, ~1 min)."""
    return trained_hybrid_dir()


@pytest.fixture(scope="module")
def hf_side(trained_dir):
    """(model, MTP head) loaded back from the checkpoint, and the replay of every prompt."""
    model, head = load_trained(trained_dir)
    return model, head, [replay_spec(model, head, p, MAX_TOKENS, K) for p in PROMPTS]


def engine(path, **spec) -> LLM:
    """Our engine over the checkpoint, float32 (a small KV pool: 8 sequences of <= 64 tokens)."""
    return LLM(str(path), dtype="float32", device="cpu", max_model_len=64, num_kv_blocks=64,
               **spec)


def mtp_engine(path, adaptive: bool) -> LLM:
    return engine(path, speculative_algorithm="nextn", speculative_num_steps=K,
                  speculative_adaptive=adaptive)


@pytest.fixture(scope="module")
def plain(trained_dir) -> list[list[int]]:
    return [r.outputs[0].token_ids for r in engine(trained_dir).generate(PROMPTS, GREEDY)]


def generate(llm: LLM, one_at_a_time: bool):
    """Completions for PROMPTS, batched together or one request at a time."""
    if one_at_a_time:
        return [llm.generate([p], GREEDY)[0].outputs[0] for p in PROMPTS]
    return [r.outputs[0] for r in llm.generate(PROMPTS, GREEDY)]


def test_teacher_forced_accuracy_of_the_exported_weights(hf_side):
    """The checkpoint (loaded back into the HF training modules) predicts held-out progressions:
    next token and, through the MTP head, the token after it, from the third position on."""
    model, head, _ = hf_side
    ids = sample_batch(torch.Generator().manual_seed(999), 32, TRAIN["seq_len"])
    lm_acc, mtp_acc = accuracies(model, head, ids)
    assert lm_acc >= 0.99
    assert mtp_acc >= 0.95


def test_plain_engine_equals_hf_greedy(plain, hf_side):
    assert plain == [tokens for tokens, _ in hf_side[2]]
    assert all(len(t) == MAX_TOKENS for t in plain)


@pytest.mark.parametrize("one_at_a_time", [False, True], ids=["batch", "single"])
def test_mtp_fixed_drafts_match_replay(trained_dir, plain, hf_side, one_at_a_time):
    """Adaptive off: every step drafts min(3, room). Same tokens as plain decoding; each
    request's (drafts, accepted, verify steps) and the engine-wide accepted-per-step histogram
    equal the HF replay; acceptance length >= 1.5."""
    llm = mtp_engine(trained_dir, adaptive=False)
    outs = generate(llm, one_at_a_time)
    assert [o.token_ids for o in outs] == plain
    replays = [steps for _, steps in hf_side[2]]
    assert [(o.spec.num_draft_tokens, o.spec.num_accepted_tokens, o.spec.num_verify_steps)
            for o in outs] == [(sum(n for n, _ in s), sum(a for _, a in s), len(s))
                               for s in replays]
    hist = [0] * (K + 1)
    for steps in replays:
        for _, a in steps:
            hist[a] += 1
    m = llm.engine.spec_metrics
    assert m.accepted_per_step == hist
    assert m.acceptance_length >= 1.5


@pytest.mark.parametrize("one_at_a_time", [False, True], ids=["batch", "single"])
def test_mtp_adaptive_keeps_outputs_and_accepts(trained_dir, plain, one_at_a_time):
    llm = mtp_engine(trained_dir, adaptive=True)
    outs = generate(llm, one_at_a_time)
    assert [o.token_ids for o in outs] == plain
    m = llm.engine.spec_metrics
    assert m.num_verify_steps > 0
    assert m.acceptance_length >= 1.5
