"""The whole engine on tiny hybrid checkpoints (Qwen3-Next with MoE and an MTP layer): greedy
output identical with every proposer on or off, exact recurrent-state rollback after verify
steps, max_model_len while drafting, and the MTP checks (issue 4)."""

from __future__ import annotations

import pytest
import torch

from harness_hybrid import HybridHarness, one_thread, tiny_hybrid_hf
from hybrid_checkpoint import random_mtp_checkpoint, write_checkpoint
from mtpserve import LLM, SamplingParams
from mtpserve.spec.forced import ForcedAcceptProposer

K = 3
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
KW = dict(dtype="float32", max_model_len=256, num_kv_blocks=256, block_size=4, max_num_seqs=8)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return random_mtp_checkpoint(tmp_path_factory.mktemp("hybrid") / "tiny")


def prompts(n=24, seed=0):
    """Mixed lengths; every third prompt repeats a phrase (n-gram drafts find matches there)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        if i % 3 == 0:
            phrase = torch.randint(2, 256, (4,), generator=g).tolist()
            out.append(phrase * 4)
        else:
            out.append(torch.randint(2, 256, (3 + (7 * i) % 29,), generator=g).tolist())
    return out


@pytest.fixture(scope="module")
def reference(ckpt):
    llm = LLM(str(ckpt[0]), **KW)
    return [r.outputs[0].token_ids for r in llm.generate(prompts(), GREEDY)]


def spec_llm(path, algo, **kw):
    extra = {"speculative_draft_model_path": "self"} if algo == "draft" else {}
    return LLM(str(path), speculative_algorithm=algo, speculative_num_steps=K,
               speculative_adaptive=False, **extra, **{**KW, **kw})


@pytest.mark.parametrize("algo", ["nextn", "mtp", "ngram", "forced_accept", "forced_reject",
                                  "draft"])
def test_greedy_equal_with_speculation_8_concurrent_and_alone(ckpt, reference, algo):
    llm = spec_llm(ckpt[0], algo)
    ps = prompts()
    together = [r.outputs[0].token_ids for r in llm.generate(ps, GREEDY)]
    assert together == reference
    for i in (0, 5, 13):
        assert llm.generate([ps[i]], GREEDY)[0].outputs[0].token_ids == reference[i]
    m = llm.engine.spec_metrics
    assert m.num_verify_steps > 0
    if algo == "forced_accept":
        assert m.num_accepted_tokens == m.num_draft_tokens
    if algo == "forced_reject":
        assert m.num_accepted_tokens == 0


class _PartialAccept(ForcedAcceptProposer):
    """Drafts the target's own greedy tokens but spoils draft number ``step % (k + 1)``, so step
    after step every acceptance count 0..k occurs, for every request."""

    step = 0

    def draft(self, work):
        super().draft(work)
        bad = _PartialAccept.step % (self.k + 1)
        _PartialAccept.step += 1
        for seq, _ in work:
            if bad < len(seq.draft_token_ids):
                d = seq.draft_token_ids
                seq.draft_token_ids = d[:bad] + [d[bad] % 250 + 3] + d[bad + 1:]


def test_state_after_verify_equals_a_fresh_prefill_of_the_accepted_text(ckpt):
    path, hf, weights = ckpt
    llm = spec_llm(path, "forced_accept")
    eng = llm.engine
    eng.proposer.__class__ = _PartialAccept
    ref = HybridHarness(hf, weights, k=K)
    ps = prompts(6, seed=3)
    for i, p in enumerate(ps):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=24, temperature=0.0,
                                                   ignore_eos=True))
    seen_j, checked = set(), 0
    while eng.has_unfinished_requests():
        before = eng.spec_metrics.accepted_per_step.copy()
        eng.step()
        seen_j |= {j for j, (a, b) in enumerate(zip(before, eng.spec_metrics.accepted_per_step))
                   if b > a}
        for seq in list(eng.scheduler.running):
            if seq.in_prefill:
                continue
            fresh = ref.new_seq(seq.token_ids[: seq.num_computed_tokens], rid=f"ref{checked}")
            ref.step([(fresh, seq.num_computed_tokens)])
            cache = eng.runner.state_cache
            for layer, (conv, ssm) in enumerate(ref.slot_states(fresh)):
                assert (cache.conv[layer][seq.state_slot] - conv).abs().max() <= 1e-5
                assert (cache.ssm[layer][seq.state_slot] - ssm).abs().max() <= 1e-5
            ref.release(fresh)
            checked += 1
    assert seen_j == set(range(K + 1)) and checked > 20


def test_ngram_steps_alternate_between_drafts_and_none(ckpt, reference):
    llm = LLM(str(ckpt[0]), speculative_algorithm="ngram", speculative_num_steps=K, **KW)
    ps = prompts()
    results = llm.generate(ps, GREEDY)
    assert [r.outputs[0].token_ids for r in results] == reference
    hist = llm.engine.spec_metrics.accepted_per_step
    assert hist[0] > 0 and sum(hist[1:]) > 0  # rejected and accepted drafts both happened
    per_request = [r.outputs[0].spec for r in results]
    steps = [len(r.outputs[0].token_ids) - 1 - (s.num_accepted_tokens if s else 0)
             for r, s in zip(results, per_request)]
    assert any(s is None or s.num_verify_steps < n for s, n in zip(per_request, steps))


def test_same_long_prefix_twice_with_nextn(ckpt):
    llm = spec_llm(ckpt[0], "nextn")
    long = prompts(1, seed=9)[0] * 6
    a = llm.generate([long], GREEDY)[0].outputs[0].token_ids
    b = llm.generate([long + [7, 8]], GREEDY)[0]
    c = llm.generate([long], GREEDY)[0].outputs[0].token_ids
    plain = LLM(str(ckpt[0]), **KW).generate([long, long + [7, 8]], GREEDY)
    assert a == c == plain[0].outputs[0].token_ids
    assert b.outputs[0].token_ids == plain[1].outputs[0].token_ids


@pytest.mark.parametrize("algo", ["nextn", "forced_accept"])
def test_max_model_len_reached_while_drafting(ckpt, algo):
    p = prompts(2, seed=4)[1]
    limit = len(p) + 9
    params = SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True)
    ref = LLM(str(ckpt[0]), **{**KW, "max_model_len": limit}).generate([p], params)[0].outputs[0]
    out = spec_llm(ckpt[0], algo, max_model_len=limit).generate([p], params)[0].outputs[0]
    assert out.token_ids == ref.token_ids and len(out.token_ids) == 9
    assert out.finish_reason == ref.finish_reason == "length"


def test_nextn_without_mtp_tensors_names_them(tmp_path):
    hf, _ = tiny_hybrid_hf("qwen3_next", mtp_num_hidden_layers=1)
    path = write_checkpoint(tmp_path / "no-mtp", hf)
    with pytest.raises(ValueError, match=r"missing \d+ tensors: mtp\.fc\.weight"):
        LLM(str(path), speculative_algorithm="nextn", **KW)
    LLM(str(path), **KW)  # without speculation the checkpoint serves fine


def test_nextn_on_a_model_without_mtp_layers(smollm2_path):
    with pytest.raises(ValueError, match="needs a model with MTP layers"):
        LLM(None, dtype="float32", max_model_len=256, num_kv_blocks=32,
            speculative_algorithm="nextn")


def test_state_bytes_per_request_for_a_qwen3_next_80b_shape():
    """36 GDN layers: conv 8192 x 3 bf16 + SSM 32 x 128 x 128 float32 per layer."""
    from mtpserve.engine.state_cache import LinearAttnShape, StateCache

    shape = LinearAttnShape(conv_dim=8192, kernel=4, num_v_heads=32, head_k_dim=128,
                            head_v_dim=128)
    per_layer = 8192 * 3 * 2 + 32 * 128 * 128 * 4
    assert StateCache.bytes_per_slot(36, shape, torch.bfloat16, torch.float32) == \
        36 * per_layer == 77_266_944
