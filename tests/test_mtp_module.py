"""The MTP draft module: loading (per-expert and fused expert tensors, missing or absent mtp.*),
its own KV-cache indexing, and draft logits over a 3-step chain equal to the MTP formula written
out here with plain torch ops from the raw checkpoint tensors."""

import json

import pytest
import torch
import torch.nn.functional as F

from harness_hybrid import (HybridHarness, one_thread, random_mtp_weights, single_seq_batch,
                            tiny_hybrid_hf)
from mtpserve.engine.kv_cache import KVCache

ARCHS = {   # (model_type, config overrides, MTP experts in the per-expert checkpoint layout)
    "qwen3_next": ("qwen3_next", dict(mlp_only_layers=[2]), True),
    "qwen3_5": ("qwen3_5", dict(tie_word_embeddings=True), False),
    "qwen3_5_moe": ("qwen3_5_moe", {}, False),
}
TOL, BLOCK = 1e-4, 4


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


def make_setup(arch: str, **overrides):
    """(HF model, its config, checkpoint tensors with mtp.*, our HybridHarness) of ``arch``
    (config ``overrides`` on top of ARCHS')."""
    model_type, kw, per_expert = ARCHS[arch]
    hf, cfg = tiny_hybrid_hf(model_type, mtp_num_hidden_layers=1, **{**kw, **overrides})
    weights = {**hf.state_dict(), **random_mtp_weights(hf, per_expert=per_expert)}
    return hf, hf.config, weights, HybridHarness(hf, weights=weights, hf_config=cfg)


@pytest.fixture(scope="module", params=list(ARCHS))
def setup(request):
    return make_setup(request.param)


# ---- the MTP formula from raw tensors -----------------------------------------------------
def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def rope(x, pos, rot, theta):
    inv = theta ** (-torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    ang = pos.float()[:, None, None] * inv
    x1, x2 = x[..., : rot // 2], x[..., rot // 2: rot]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin(),
                      x[..., rot:]], dim=-1)


def attention(x, w, p, c, pos):
    T, D, nq, nkv = x.shape[0], c.head_dim, c.num_attention_heads, c.num_key_value_heads
    qg = (x @ w[p + "q_proj.weight"].T).view(T, nq, 2 * D)
    k = (x @ w[p + "k_proj.weight"].T).view(T, nkv, D)
    v = (x @ w[p + "v_proj.weight"].T).view(T, nkv, D)
    rope_p = c.rope_parameters
    rot, theta = int(D * rope_p["partial_rotary_factor"]), rope_p["rope_theta"]
    q = rope(rms(qg[..., :D], w[p + "q_norm.weight"]), pos, rot, theta)
    k = rope(rms(k, w[p + "k_norm.weight"]), pos, rot, theta)
    k, v = k.repeat_interleave(nq // nkv, dim=1), v.repeat_interleave(nq // nkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * D ** -0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -torch.inf)
    o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(T, nq * D)
    return (o * torch.sigmoid(qg[..., D:].reshape(T, -1))) @ w[p + "o_proj.weight"].T


def swiglu(x, gate, up, down):
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


def expert(w, p, e):
    if f"{p}experts.{e}.gate_proj.weight" in w:
        return [w[f"{p}experts.{e}.{n}_proj.weight"] for n in ("gate", "up", "down")]
    gu = w[p + "experts.gate_up_proj"][e]
    return [*gu.chunk(2, dim=0), w[p + "experts.down_proj"][e]]


def ffn(x, w, p, c):
    if p + "gate.weight" not in w:
        return swiglu(x, *(w[f"{p}{n}_proj.weight"] for n in ("gate", "up", "down")))
    probs = (x @ w[p + "gate.weight"].T).softmax(-1)
    top, idx = probs.topk(c.num_experts_per_tok, dim=-1)
    top = top / top.sum(-1, keepdim=True)
    out = torch.sigmoid(x @ w[p + "shared_expert_gate.weight"].T) * swiglu(
        x, *(w[f"{p}shared_expert.{n}_proj.weight"] for n in ("gate", "up", "down")))
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            out[t] += top[t, j] * swiglu(x[t], *expert(w, p, idx[t, j].item()))
    return out


def mtp_reference(w, c, tokens, hidden):
    """(y after mtp.norm [T, H], logits [T, vocab]) for rows at positions 0..T-1."""
    pos, p = torch.arange(len(tokens)), "mtp.layers.0."
    e = rms(w["model.embed_tokens.weight"][torch.tensor(tokens)],
            w["mtp.pre_fc_norm_embedding.weight"])
    x = torch.cat([e, rms(hidden, w["mtp.pre_fc_norm_hidden.weight"])], -1) @ w["mtp.fc.weight"].T
    x = x + attention(rms(x, w[p + "input_layernorm.weight"]), w, p + "self_attn.", c, pos)
    x = x + ffn(rms(x, w[p + "post_attention_layernorm.weight"]), w, p + "mlp.", c)
    y = rms(x, w["mtp.norm.weight"])
    return y, y @ w["lm_head.weight"].T


# ---- tests -----------------------------------------------------------------------------------
def test_draft_chain_matches_formula(setup):
    """Target prefill of n tokens, then the MTP over positions 0..n-1 (inputs x_{t+1}, h_t) in
    two calls, then two chained draft steps at positions n and n+1 fed the previous step's
    output (after mtp.norm) and its greedy draft: every logit row matches the formula."""
    drafts, ref_drafts, err = chain_against_formula(setup)
    assert drafts == ref_drafts
    assert err <= TOL


_INTERPRETED = """
import json
import fused_kernel_check as f, test_mtp_module as t
out = {}
for arch, kw in (("qwen3_next", {}), ("qwen3_5_moe", {}),
                 ("qwen3_next", dict(shared_expert_intermediate_size=32))):
    setup = t.make_setup(arch, **kw)
    for block in setup[3].model.modules():   # merged as on CUDA: a folded block runs folded
        if hasattr(block, "merge_router_weights"):
            block.merge_router_weights()
    with f.triton_on_cpu("cpu", attention=False, hybrid=True):
        out[arch + ("_folded" if kw else "")] = t.chain_against_formula(setup)
print("RESULT", json.dumps(out))
"""


def test_draft_chain_through_the_cuda_path_under_triton_interpreter():
    """The same chain with every layer of the MTP module (and the target's) on its Triton path
    (Triton's interpreter; attention on PyTorch's): the fc input's two norms written into one
    buffer, the layer's residual add inside the final norm, fused gated attention, the MoE
    combine kernel; and a shared expert folded into the experts, its choices summed by the
    final norm. Same drafts, logits within the tolerance of the formula."""
    from interpreted import run_interpreted

    res = json.loads(run_interpreted(_INTERPRETED))
    assert set(res) == {"qwen3_next", "qwen3_5_moe", "qwen3_next_folded"}
    for arch, (drafts, ref_drafts, err) in res.items():
        assert drafts == ref_drafts and err <= TOL, (arch, err)


def chain_against_formula(setup) -> tuple[list[int], list[int], float]:
    """The chain of :func:`test_draft_chain_matches_formula`: (our drafts, the formula's, the
    largest logit difference)."""
    hf, c, w, h = setup
    mtp, model = h.model.mtp, h.model
    ids = torch.randint(0, 256, (13,), generator=torch.Generator().manual_seed(3)).tolist()
    n = len(ids)
    with torch.no_grad():   # the target's last hidden state is after its final norm
        target_h = hf.model(torch.tensor([ids])).last_hidden_state[0]
        nxt = hf(torch.tensor([ids])).logits[0, -1].argmax().item()
    tokens = ids[1:] + [nxt]
    kv = KVCache(1, 8, BLOCK, c.num_key_value_heads, c.head_dim, torch.float32,
                 torch.device("cpu"))
    with torch.inference_mode():
        ys = [mtp(torch.tensor(tokens[:-1]), target_h[:-1],
                  single_seq_batch(tokens[:-1], list(range(n - 1)), kv.layers, BLOCK)),
              mtp(torch.tensor(tokens[-1:]), target_h[-1:],
                  single_seq_batch(tokens[-1:], [n - 1], kv.layers, BLOCK))]
        drafts = []
        for pos in (n, n + 1):
            drafts.append(model.compute_logits(ys[-1][-1:]).argmax().item())
            ys.append(mtp(torch.tensor(drafts[-1:]), ys[-1][-1:],
                          single_seq_batch(drafts[-1:], [pos], kv.layers, BLOCK)))
        ours = model.compute_logits(torch.cat(ys))
    ref_tokens, ref_hidden = list(tokens), target_h
    with torch.no_grad():
        for _ in range(2):
            y, logits = mtp_reference(w, c, ref_tokens, ref_hidden)
            ref_tokens.append(logits[-1].argmax().item())
            ref_hidden = torch.cat([ref_hidden, y[-1:]])
        _, ref = mtp_reference(w, c, ref_tokens, ref_hidden)
    return drafts, ref_tokens[n:], (ours - ref).abs().max().item()


def test_mtp_has_its_own_cache_index_and_ffn(setup):
    hf, c, w, h = setup
    model = h.model
    assert [a.layer_idx for a in model.mtp.attention_layers()] == [0]
    assert len(model.attention_layers()) == c.layer_types.count("full_attention")
    has_moe = any(n.startswith("mtp.layers.0.mlp.gate.") for n in w)
    assert hasattr(model.mtp.layers[0].mlp, "experts") == has_moe


def test_checkpoint_without_mtp_tensors_drops_the_module(setup):
    hf, c, w, h = setup
    plain = {n: t for n, t in w.items() if not n.startswith("mtp.")}
    assert HybridHarness(hf, weights=plain).model.mtp is None


def test_missing_mtp_tensors_are_named(setup):
    hf, c, w, h = setup
    missing = {n: t for n, t in w.items() if n != "mtp.pre_fc_norm_hidden.weight"}
    with pytest.raises(ValueError, match=r"missing 1 tensor\(s\): mtp.pre_fc_norm_hidden.weight"):
        HybridHarness(hf, weights=missing)
    one_expert = [n for n in w if n.startswith("mtp.") and ".experts.1." in n]
    if one_expert:     # per-expert layout: a missing expert tensor is named by its parameter
        partial = {n: t for n, t in w.items() if n != one_expert[0]}
        with pytest.raises(ValueError, match="of the expert tensors of mtp.layers.0.mlp.experts"):
            HybridHarness(hf, weights=partial)


def test_rms_norm_into_a_buffer_checks_the_buffer():
    """The fc input's norms write into halves of one buffer (``rms_norm(out=...)``): a
    destination of another width, dtype or a strided last dim is refused before any launch."""
    pytest.importorskip("triton")
    from mtpserve.kernels.fused_triton import rms_norm

    x, w, buf = torch.zeros(3, 8), torch.zeros(8), torch.zeros(3, 16)
    for bad in (buf[:, :7], buf[:, :8].double(), buf.view(3, 8, 2)[..., 0]):
        with pytest.raises(ValueError, match="unit stride along the last dim"):
            rms_norm(x, w, 1e-6, True, out=bad)


def test_embedding_norm_kernel_checks_its_operands():
    """The MTP's normed token embedding in one kernel (``embed_rms_norm``) refuses a
    destination of another shape or dtype and a table strided along its rows' values."""
    pytest.importorskip("triton")
    from mtpserve.kernels.fused_triton import embed_rms_norm

    ids, table, w = torch.zeros(3, dtype=torch.int64), torch.zeros(10, 8), torch.zeros(8)
    for tab, out in ((table, torch.zeros(3, 7)), (table, torch.zeros(3, 8).double()),
                     (torch.zeros(8, 10).t(), torch.zeros(3, 8))):
        with pytest.raises(ValueError, match="unit stride along N"):
            embed_rms_norm(ids, tab, w, 1e-6, True, out)
