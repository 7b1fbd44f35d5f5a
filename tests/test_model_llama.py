"""Our Llama-family forward equals HF transformers' on tiny random models (float32, CPU)."""

import pytest
import torch

from harness import Harness, tiny_hf_model

ARCHS = {
    "llama": dict(model_type="llama"),
    "llama_bias_llama3rope": dict(model_type="llama", attention_bias=True, mlp_bias=True,
                                  rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0,
                                                   "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 64}),
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3"),
    "llama_tied_mha": dict(model_type="llama", tie_word_embeddings=True, num_key_value_heads=4),
}
TOL = 1e-4


@pytest.fixture(scope="module", params=list(ARCHS))
def pair(request):
    kw = dict(ARCHS[request.param])
    hf = tiny_hf_model(kw.pop("model_type"), **kw)
    return hf, Harness(hf)


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def prompt(n, seed=1, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def test_prefill_logits_match_hf(pair):
    hf, h = pair
    ids = prompt(23)
    (ours,) = h.run([(h.new_seq(ids), len(ids))])
    ref = hf_logits(hf, ids)
    assert (ours - ref).abs().max().item() <= TOL


def test_chunked_prefill_matches_one_prefill(pair):
    hf, h = pair
    ids = prompt(31, seed=2)
    seq = h.new_seq(ids)
    parts = [h.run([(seq, n)])[0] for n in (5, 7, 11, 8)]
    ref = hf_logits(hf, ids)
    assert (torch.cat(parts) - ref).abs().max().item() <= TOL


def test_decode_steps_match_hf(pair):
    hf, h = pair
    ids = prompt(20, seed=3)
    seq = h.new_seq(ids)
    steps = [h.run([(seq, 9)])[0]] + [h.run([(seq, 1)])[0] for _ in range(11)]
    ref = hf_logits(hf, ids)
    assert (torch.cat(steps) - ref).abs().max().item() <= TOL


def test_mixed_batch_each_sequence_matches_hf(pair):
    """A prefill chunk, a long prefill and two decodes share one forward pass."""
    hf, h = pair
    prompts = [prompt(n, seed=10 + n) for n in (12, 40, 6, 9)]
    seqs = [h.new_seq(p, f"r{i}") for i, p in enumerate(prompts)]
    h.run([(seqs[2], 5), (seqs[3], 8)])          # bring two of them to their last token
    outs = h.run([(seqs[0], 12), (seqs[1], 40), (seqs[2], 1), (seqs[3], 1)])
    for p, out, start in zip(prompts, outs, (0, 0, 5, 8)):
        ref = hf_logits(hf, p)[start:]
        assert (out - ref).abs().max().item() <= TOL
