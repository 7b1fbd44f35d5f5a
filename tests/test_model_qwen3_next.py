"""Our hybrid Qwen3-Next / Qwen3.5 forward equals HF transformers' on tiny random models (float32,
CPU): prefill (chunked and recurrent paths), chunked prefill, decode, mixed varlen batches, and the
per-token recurrent states a verify step leaves in the scratch buffers."""

import pytest
import torch

from harness_hybrid import HybridHarness, one_thread, tiny_hybrid_hf
from mtpserve.kernels.gated_delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule

ARCHS = {
    # MoE layers plus one dense MLP layer (mlp_only_layers), grouped qkvz / ba projections
    "qwen3_next": ("qwen3_next", dict(mlp_only_layers=[2])),
    # dense MLP, flat in_proj_qkv / z / b / a, tied embeddings, top-level config with text_config
    "qwen3_5": ("qwen3_5", dict(tie_word_embeddings=True)),
    # MoE without a norm_topk_prob flag (always renormalised)
    "qwen3_5_moe": ("qwen3_5_moe", dict(num_experts_per_tok=3)),
}
TOL, STATE_TOL, K = 1e-4, 1e-5, 4


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module", params=list(ARCHS))
def pair(request):
    model_type, kw = ARCHS[request.param]
    hf, cfg = tiny_hybrid_hf(model_type, **kw)
    return hf, HybridHarness(hf, hf_config=cfg, k=K)


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def prompt(n, seed=1, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def max_diff(a, b):
    return (a - b).abs().max().item()


@pytest.mark.parametrize("n", [9, 70])   # recurrent path (<= 16 tokens) and two 64-token chunks
def test_prefill_logits_match_hf(pair, n):
    hf, h = pair
    ids = prompt(n)
    seq = h.new_seq(ids)
    (ours,), _ = h.step([(seq, n)])
    h.release(seq)
    assert max_diff(ours, hf_logits(hf, ids)) <= TOL


def test_chunked_prefill_matches_one_prefill(pair):
    """State carried across chunks of both forms: chunked (> 16 tokens) and recurrent."""
    hf, h = pair
    ids = prompt(75, seed=2)
    seq = h.new_seq(ids)
    parts = [h.step([(seq, n)])[0][0] for n in (20, 5, 30, 1, 19)]
    h.release(seq)
    assert max_diff(torch.cat(parts), hf_logits(hf, ids)) <= TOL


def test_decode_steps_match_hf(pair):
    hf, h = pair
    ids = prompt(30, seed=3)
    seq = h.new_seq(ids)
    steps = [h.step([(seq, 12)])[0][0]] + [h.step([(seq, 1)])[0][0] for _ in range(18)]
    h.release(seq)
    assert max_diff(torch.cat(steps), hf_logits(hf, ids)) <= TOL


def test_mixed_batch_each_sequence_matches_hf(pair):
    """A long prefill chunk, a short prefill, two decodes and a verify share one forward; then the
    chunked sequence finishes its prompt beside another decode."""
    hf, h = pair
    prompts = [prompt(n, seed=10 + n) for n in (50, 9, 7, 13, 11)]
    drafts = prompt(K, seed=99)
    seqs = [h.new_seq(p, f"r{i}") for i, p in enumerate(prompts)]
    h.step([(seqs[2], 6), (seqs[3], 12), (seqs[4], 10)])        # bring three to their last token
    outs, _ = h.step([(seqs[0], 30), (seqs[1], 9), (seqs[2], 1), (seqs[3], 1),
                      (seqs[4], 1, drafts)])
    refs = [hf_logits(hf, p) for p in prompts[:4]] + [hf_logits(hf, prompts[4] + drafts)]
    for out, ref, start in zip(outs, refs, (0, 0, 6, 12, 10)):
        assert max_diff(out, ref[start:start + out.shape[0]]) <= TOL
    seqs[3].token_ids.append(5)
    (rest, dec), _ = h.step([(seqs[0], 20), (seqs[3], 1)])
    h.release(*seqs)
    assert max_diff(rest, refs[0][30:]) <= TOL
    assert max_diff(dec, hf_logits(hf, prompts[3] + [5])[-1:]) <= TOL


def test_verify_scratch_states_equal_fresh_prefill(pair):
    """After a verify step with 1 + K query tokens, scratch position j of every linear-attention
    layer holds the state of a fresh sequence that prefilled the same context and then just the
    first j + 1 of those tokens (no drafts); the slot holds the state after all of them; the
    verify logits equal HF's."""
    hf, h = pair
    ctx, drafts = prompt(23, seed=4), prompt(K, seed=5)
    seq = h.new_seq(ctx)
    h.step([(seq, len(ctx) - 1)])
    (logits,), _ = h.step([(seq, 1, drafts)])
    assert max_diff(logits, hf_logits(hf, ctx + drafts)[len(ctx) - 1:]) <= TOL
    cache = h.runner.state_cache
    row = 0    # the only sequence with drafts in that step takes scratch row 0
    for j in range(K + 1):
        fresh = h.new_seq(ctx + drafts[:j])
        h.step([(fresh, len(ctx) - 1)])
        h.step([(fresh, 1 + j)])
        for i, (conv, ssm) in enumerate(h.slot_states(fresh)):
            assert max_diff(cache.conv_scratch[i][row, j], conv) <= STATE_TOL, (j, i)
            assert max_diff(cache.ssm_scratch[i][row, j], ssm) <= STATE_TOL, (j, i)
        h.release(fresh)
    for i, (conv, ssm) in enumerate(h.slot_states(seq)):
        assert torch.equal(conv, cache.conv_scratch[i][row, K])
        assert torch.equal(ssm, cache.ssm_scratch[i][row, K])
    h.release(seq)


def test_layer_indices_follow_the_engine_contract(pair):
    hf, h = pair
    types = hf.config.layer_types
    attn, lin = h.model.attention_layers(), h.model.linear_attention_layers()
    assert [a.layer_idx for a in attn] == list(range(types.count("full_attention")))
    assert [g.state_idx for g in lin] == list(range(types.count("linear_attention")))
    c = hf.config
    s = lin[0].state_shape
    assert (s.conv_dim, s.kernel, s.num_v_heads, s.head_k_dim, s.head_v_dim) == (
        2 * c.linear_num_key_heads * c.linear_key_head_dim
        + c.linear_num_value_heads * c.linear_value_head_dim, c.linear_conv_kernel_dim,
        c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim)
    assert len(h.runner.kv_cache.layers) == len(attn)


def test_multimodal_checkpoint_names_load_text_part():
    """Qwen3.5 checkpoints keep the text model under model.language_model and a vision tower
    under model.visual; mtp.* is ignored when the config has no MTP layers."""
    hf, cfg = tiny_hybrid_hf("qwen3_5", seed=3)
    sd = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
          for k, v in hf.state_dict().items()}
    sd["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    sd["mtp.fc.weight"] = torch.zeros(3, 3)
    h = HybridHarness(hf, weights=sd, hf_config=cfg)
    assert h.model.mtp is None
    ids = prompt(20, seed=6)
    (ours,), _ = h.step([(h.new_seq(ids), 20)])
    assert max_diff(ours, hf_logits(hf, ids)) <= TOL


def test_missing_and_unknown_tensors_are_named():
    hf, cfg = tiny_hybrid_hf("qwen3_next", seed=4)
    sd = dict(hf.state_dict())
    missing = dict(sd)
    del missing["model.layers.2.linear_attn.A_log"]
    with pytest.raises(ValueError,
                       match=r"missing 1 tensor\(s\): model.layers.2.linear_attn.A_log"):
        HybridHarness(hf, weights=missing, hf_config=cfg)
    with pytest.raises(ValueError, match="'model.layers.0.linear_attn.bogus' matches no model"):
        HybridHarness(hf, weights={**sd, "model.layers.0.linear_attn.bogus": torch.zeros(1)},
                      hf_config=cfg)


def test_chunked_and_recurrent_kernels_agree():
    """The two forms of the gated delta rule give the same outputs and final state (3 chunks,
    grouped value heads, a non-zero initial state)."""
    g = torch.Generator().manual_seed(0)
    T, Hk, Hv, Dk, Dv = 150, 2, 4, 8, 12
    q, k = torch.randn(T, Hk, Dk, generator=g), torch.randn(T, Hk, Dk, generator=g)
    v = torch.randn(T, Hv, Dv, generator=g)
    decay, beta = -2 * torch.rand(T, Hv, generator=g), torch.rand(T, Hv, generator=g)
    s0 = torch.randn(Hv, Dk, Dv, generator=g)
    o1, s1 = chunk_gated_delta_rule(q, k, v, decay, beta, s0)
    o2, s2, states = recurrent_gated_delta_rule(q[None], k[None], v[None], decay[None],
                                                beta[None], s0[None], keep_states=True)
    assert max_diff(o1, o2[0]) <= 1e-5 and max_diff(s1, s2[0]) <= 1e-5
    assert torch.equal(states[0, -1], s2[0])
