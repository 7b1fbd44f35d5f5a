"""MTP drafting through the FR-Spec head (``--speculative-token-map``) in the whole engine, on the
CPU in float32: greedy output equal to plain decoding with every draft inside the map, through the
draft chain and the step loop alike; acceptance on the trained tiny model unchanged by a map that
holds every token the unrestricted drafts and the target produce; sampled drafts' q zero outside
the map; the map checked at engine start."""

from __future__ import annotations

import json

import pytest
import torch

from harness_draft_head import (HOT, KW, TRAINED_GREEDY, K, ckpt,  # noqa: F401 (a fixture)
                                prompts, token_ids, trained_llm)
from harness_hybrid import one_thread_module  # noqa: F401 (a fixture)
from harness_mtp_chain import drafts_of, mtp_llm
from mtpserve import LLM, SamplingParams
from mtpserve.spec.draft_head import FullVocabHead, ReducedVocabHead
from trained_hybrid import held_out_prompts

pytestmark = pytest.mark.usefixtures("one_thread_module")


def drafted(log) -> list[int]:
    """Every draft token of an ``mtp_llm`` log."""
    return [t for calls, _ in log for _, _, d, _ in calls for t in d]


@pytest.fixture(scope="module")
def runs(ckpt):
    """Per (use_chain, token map or None): (token ids, draft log, engine)."""
    path, hot = ckpt
    out = {}
    for use_chain in (True, False):
        for tm in (hot, None):
            llm, log = mtp_llm(path, use_chain, K, speculative_token_map=tm, **KW)
            out[use_chain, tm] = (token_ids(llm, prompts()), log, llm)
    return out


def test_greedy_output_with_a_token_map_equals_plain_decoding(ckpt, runs):
    path, hot = ckpt
    plain = token_ids(LLM(str(path), **KW), prompts())
    for use_chain in (True, False):
        ids, log, llm = runs[use_chain, hot]
        assert ids == plain
        assert isinstance(llm.engine.proposer.head, ReducedVocabHead)
        assert llm.engine.proposer.chain.head is llm.engine.proposer.head
    assert isinstance(runs[True, None][2].engine.proposer.head, FullVocabHead)


def test_the_map_is_read_once_and_its_head_kept_out_of_the_kv_budget(ckpt, runs):
    """The engine reads the map before the weights; the runner keeps the head's bytes back
    (float32 here: 100 ids x hidden x 4) and the proposer's head holds those very ids."""
    _, hot = ckpt
    eng = runs[True, hot][2].engine
    hidden = eng.model_config.hidden_size
    assert eng.token_map.tolist() == HOT.tolist()
    assert eng.runner.reserve_bytes == 100 * hidden * 4
    assert eng.proposer.head.ids.tolist() == sorted(HOT.tolist())
    plain = runs[True, None][2].engine
    assert plain.token_map is None and plain.runner.reserve_bytes == 0


def test_every_draft_is_inside_the_map_chain_and_loop_alike(ckpt, runs):
    _, hot = ckpt
    chain, loop = runs[True, hot][1], runs[False, hot][1]
    assert [calls for calls, _ in chain] == [calls for calls, _ in loop]
    assert all(used for _, used in chain) and not any(used for _, used in loop)
    drafts = drafted(chain)
    assert len(drafts) > 50 and set(drafts) <= set(HOT.tolist())
    # without the map the same MTP layer drafts outside it: the map really restricted the head
    free = drafted(runs[True, None][1])
    assert len(set(free) - set(HOT.tolist())) > 10


def log_drafts(llm: LLM) -> list[tuple[list[int], torch.Tensor | None]]:
    """Wrap the engine's proposer so each drafted sequence's (draft ids, q) is recorded."""
    proposer, seen = llm.engine.proposer, []
    draft = proposer.draft

    def logged(work):
        draft(work)
        seen.extend((drafts_of(proposer, s), s.draft_probs) for s, _ in work)

    proposer.draft = logged
    return seen


def test_sampled_drafts_have_q_zero_outside_the_map_and_one_inside(ckpt):
    path, hot = ckpt
    llm = LLM(str(path), speculative_algorithm="nextn", speculative_num_steps=K,
              speculative_adaptive=False, speculative_token_map=hot, **KW)
    llm.engine.proposer.sampled_drafts = True   # drawn drafts (the default drafts the argmax)
    seen = log_drafts(llm)
    params = [SamplingParams(max_tokens=12, temperature=0.9, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=1.3, top_p=0.9, seed=4,
                             repetition_penalty=1.3, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0.7, top_k=20, seed=5, ignore_eos=True)]
    llm.generate(prompts()[:3], params)
    outside = torch.ones(256, dtype=torch.bool)
    outside[HOT] = False
    qs = [(d, q) for d, q in seen if d]
    assert len(qs) >= 9 and all(q is not None and q.shape == (len(d), 256) for d, q in qs)
    for d, q in qs:
        assert q.dtype == torch.float32
        assert (q[:, outside] == 0).all()
        assert ((q.sum(-1) - 1).abs() <= 1e-5).all()
        assert (q[torch.arange(len(d)), d] > 0).all() and set(d) <= set(HOT.tolist())


@pytest.mark.parametrize("content, message", [
    (None, "--speculative-token-map: no such file: "),
    ([0, 256], "token id 256 is outside the vocabulary [0, 256)"),
])
def test_the_map_is_checked_at_engine_start(ckpt, tmp_path, monkeypatch, content, message):
    """Before the weights load (a big model's minutes): the model runner is never built."""
    from mtpserve.engine import engine

    def no_runner(*args, **kwargs):
        raise AssertionError("the weights were loaded before the map was checked")

    monkeypatch.setattr(engine, "ModelRunner", no_runner)
    path = tmp_path / "m.json"
    if content is not None:
        path.write_text(json.dumps(content))
    with pytest.raises(ValueError) as e:
        LLM(str(ckpt[0]), speculative_algorithm="nextn", speculative_token_map=str(path), **KW)
    assert message in str(e.value)


# ---- acceptance on the trained tiny model (random MTP weights accept nothing) ------------------
def trained_run(ps, token_map: str | None):
    """(outputs, every draft token, accepted-per-step histogram) of greedy MTP decoding of
    ``ps`` on the trained checkpoint, adaptive policy off (every step drafts min(k, room))."""
    llm = trained_llm(speculative_token_map=token_map)
    seen = log_drafts(llm)
    outs = [r.outputs[0] for r in llm.generate(ps, TRAINED_GREEDY)]
    return outs, [t for d, _ in seen for t in d], llm.engine.spec_metrics.accepted_per_step


def counts(outs) -> list[tuple[int, int, int]]:
    return [(o.spec.num_draft_tokens, o.spec.num_accepted_tokens, o.spec.num_verify_steps)
            for o in outs]


def test_acceptance_with_a_map_of_the_tokens_in_play_is_unchanged(tmp_path):
    """A map holding every token the target emits and every token the unrestricted MTP drafts:
    each draft's argmax is inside it, so drafts, acceptance and verify steps are identical."""
    ps = held_out_prompts(8, 6)[:3]
    outs, drafts, hist = trained_run(ps, None)
    emitted = {t for o in outs for t in o.token_ids}
    assert len(emitted) < 62 and drafts and set(drafts) - emitted   # a real restriction
    path = tmp_path / "in_play.json"
    path.write_text(json.dumps(sorted(emitted | set(drafts))))
    outs2, drafts2, hist2 = trained_run(ps, str(path))
    assert [o.token_ids for o in outs2] == [o.token_ids for o in outs]
    assert drafts2 == drafts and hist2 == hist and counts(outs2) == counts(outs)
    assert sum(a for _, a, _ in counts(outs)) >= 30


def test_a_map_of_the_emitted_tokens_only_keeps_output_and_accepts_no_less(tmp_path):
    """Only the emitted tokens: the MTP's guesses outside them are gone, so the head picks
    among the right candidates (on these prompts: more accepted, never fewer per request)."""
    ps = held_out_prompts(8, 6)[:3]
    outs, _, _ = trained_run(ps, None)
    emitted = sorted({t for o in outs for t in o.token_ids})
    path = tmp_path / "emitted.json"
    path.write_text(json.dumps(emitted))
    outs2, drafts2, _ = trained_run(ps, str(path))
    assert [o.token_ids for o in outs2] == [o.token_ids for o in outs]
    assert set(drafts2) <= set(emitted)
    before, after = counts(outs), counts(outs2)
    assert all(a2 >= a for (_, a, _), (_, a2, _) in zip(before, after))
    assert sum(a for _, a, _ in after) > sum(a for _, a, _ in before)
