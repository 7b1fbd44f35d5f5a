"""A tiny Qwen3-Next model trained together with its MTP layer on a predictable corpus, cached on
disk: the fixture that shows the MTP draft path is wired right (random MTP weights accept ~0).

Corpus: arithmetic progressions over the word ids 2..V-1, ``x_i = 2 + (a + i * d) mod (V - 2)``
with a random start a and a step d from ``STEPS``; the step is read off the context, so every
next token, and the next-next token that the MTP predicts, is determined by the first two. No EOS.

Training (float32, CPU, one thread, fixed seeds) runs a twin of our own (``twin_forward``): the
checkpoint's tensors under their HF names and a plain PyTorch forward of Qwen3-Next with its MTP
layer, initialised by ``init_params``; none of HF's modelling code, whose releases change the
backward pass bit by bit (transformers 5.25's Gated DeltaNet did), nor HF's initialisation. The
MTP has the semantics of our inference module (src/mtpserve/models/mtp.py): at position t the pair
(h_t, x_{t+1}) gives ``y_t = norm(layer(fc(cat(norm_e(embed(x_{t+1})), norm_h(h_t)))))`` with
RoPE position t and causal attention over the MTP's own positions 0..t; ``lm_head(y_t)`` predicts
x_{t+2} (teacher forcing; h_t is the target's last hidden state after its final norm). Loss =
next-token CE + next-next-token CE (the MTP objective of DeepSeek-V3, sec. 2.2, with weight 1),
Adam. The training process runs ATen's AVX2 kernels on any x86 CPU that has AVX2 or AVX-512
(``training_cpu_capability``; the AVX-512 ones trained other weights): the weights are then the
same on either kind of machine and with any transformers release. HF's modules
(``Qwen3NextForCausalLM``, and ``HFMTPHead`` built from the same file's ``Qwen3NextDecoderLayer``
and ``Qwen3NextRMSNorm``) load the weights back for the held-out accuracies, the check that HF
reads the checkpoint as the twin does, and the cache-free replay of speculative decoding
(``replay_spec``) that the engine tests compare with.

Cache: ``$MTPSERVE_CACHE_DIR/fixtures/trained-hybrid-<hash>/`` (default root ``~/.cache/mtpserve``),
``<hash>`` digesting the text of this file and of hybrid_checkpoint.py, the config, the training
settings, the torch / transformers versions and the training CPU kernels; built by a child Python
(``build_in_subprocess``) in a temporary sibling directory and renamed into place (other
processes see all or none). Training takes ~40 s of CPU time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from harness_hybrid import MOE, SHAPE, one_thread
from hybrid_checkpoint import write_checkpoint

VOCAB = 64
SPAN = VOCAB - 2                 # progressions run over the ids 2..VOCAB-1
STEPS = (1, 2, 3)                # the common differences d
# 8 layers, three Gated DeltaNet then one full attention (Qwen3-Next's pattern): the adaptive
# policy prices an MTP step at 2 / num_hidden_layers decode steps, so 4 layers never pay to draft
CONFIG = {**SHAPE, **MOE, "vocab_size": VOCAB, "num_hidden_layers": 8,
          "full_attention_interval": 4, "mtp_num_hidden_layers": 1, "max_position_embeddings": 128}
TRAIN = dict(seed=0, steps=300, batch=16, seq_len=40, lr=3e-3, warmup=20)
MARKER = "trained-hybrid.json"


# ---- corpus ---------------------------------------------------------------------------------
def progression(start: int, d: int, length: int) -> list[int]:
    """Token ids ``2 + (start + i * d) mod SPAN`` for i < length."""
    return [2 + (start + i * d) % SPAN for i in range(length)]


def sample_batch(gen: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """[batch, length] int64 progressions with uniform random starts and steps."""
    starts = torch.randint(0, SPAN, (batch,), generator=gen).tolist()
    steps = torch.randint(0, len(STEPS), (batch,), generator=gen).tolist()
    return torch.tensor([progression(a, STEPS[s], length) for a, s in zip(starts, steps)])


def held_out_prompts(n: int, length: int, seed: int = 1234) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens drawn with their own seed (not the training stream);
    steps cycle through ``STEPS`` so every step is covered."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, SPAN, (n,), generator=gen).tolist()
    return [progression(a, STEPS[i % len(STEPS)], length) for i, a in enumerate(starts)]


# ---- the training twin: the checkpoint's parameters and a forward of our own ------------------
# Training runs none of HF's modelling code: HF's torch fallbacks change between releases in ways
# that keep the forward but not the backward bit for bit (5.25 split the Gated DeltaNet's chunked
# call into a chunked part and a recurrent tail: gradients moved by ~1 ulp), and 300 steps of Adam
# grow any such difference into other weights, other drafts (so does a change of CPU kernels, even
# in float64: see training_cpu_capability).
def _shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of every trained tensor (HF's names; ``mtp.layers.0`` a
    full-attention layer with the MoE FFN, as every layer of ``CONFIG``)."""
    H, V, E = cfg.hidden_size, cfg.vocab_size, cfg.num_experts
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, K = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    I, S = cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    mixers = {"linear_attention": {
        "linear_attn.conv1d.weight": (2 * nk * dk + nv * dv, 1, K),
        "linear_attn.in_proj_qkvz.weight": (2 * nk * dk + 2 * nv * dv, H),
        "linear_attn.in_proj_ba.weight": (2 * nv, H),
        "linear_attn.dt_bias": (nv,), "linear_attn.A_log": (nv,),
        "linear_attn.norm.weight": (dv,), "linear_attn.out_proj.weight": (H, nv * dv)},
        "full_attention": {
        "self_attn.q_proj.weight": (2 * Hq * D, H), "self_attn.k_proj.weight": (Hkv * D, H),
        "self_attn.v_proj.weight": (Hkv * D, H), "self_attn.o_proj.weight": (H, Hq * D),
        "self_attn.q_norm.weight": (D,), "self_attn.k_norm.weight": (D,)}}
    ffn = {"mlp.gate.weight": (E, H), "mlp.experts.gate_up_proj": (E, 2 * I, H),
           "mlp.experts.down_proj": (E, H, I), "mlp.shared_expert.gate_proj.weight": (S, H),
           "mlp.shared_expert.up_proj.weight": (S, H),
           "mlp.shared_expert.down_proj.weight": (H, S), "mlp.shared_expert_gate.weight": (1, H)}

    def layer(prefix, kind):
        return {prefix + n: s for n, s in {"input_layernorm.weight": (H,), **mixers[kind],
                                           "post_attention_layernorm.weight": (H,),
                                           **ffn}.items()}

    out = {"model.embed_tokens.weight": (V, H)}
    for i, kind in enumerate(cfg.layer_types):
        out.update(layer(f"model.layers.{i}.", kind))
    out.update({"model.norm.weight": (H,), "lm_head.weight": (V, H),
                "mtp.fc.weight": (H, 2 * H), "mtp.pre_fc_norm_embedding.weight": (H,),
                "mtp.pre_fc_norm_hidden.weight": (H,)})
    out.update(layer("mtp.layers.0.", "full_attention"))
    out["mtp.norm.weight"] = (H,)
    return out


def init_params(cfg, seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Fresh trainable tensors of ``_shapes(cfg)`` (``dtype``, requires_grad), drawn in that
    order from one ``torch.Generator(seed)`` in float64, then cast: every matrix (embedding,
    projections, depthwise conv, router, experts, ``fc``, LM head) N(0, 0.02); the zero-centred
    RMSNorm weights 0 (scale 1), the gated norm's weights 1, ``dt_bias`` 1,
    ``A_log = log U(0.01, 16)`` (decay rates spread over the heads)."""
    gen = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in _shapes(cfg).items():
        if name.endswith("A_log"):
            t = torch.empty(shape, dtype=torch.float64).uniform_(0.01, 16, generator=gen).log()
        elif name.endswith(("dt_bias", "linear_attn.norm.weight")):
            t = torch.ones(shape, dtype=torch.float64)
        elif len(shape) == 1:                                   # zero-centred RMSNorm
            t = torch.zeros(shape, dtype=torch.float64)
        else:
            t = torch.empty(shape, dtype=torch.float64).normal_(0.0, 0.02, generator=gen)
        params[name] = t.to(dtype).requires_grad_()
    return params


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm over the last dim: ``x / sqrt(mean(x^2) + eps) * (1 + w)``."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def _l2(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + 1e-6)`` over the last dim (the Gated DeltaNet's q/k norm)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def delta_rule(q, k, v, g, beta) -> torch.Tensor:
    """Gated delta rule from a zero state, the whole sequence at once: q, k [B, T, N, dk]
    (q scaled, both unit length), v [B, T, N, dv], g (log decay, <= 0) and beta [B, T, N];
    returns o [B, T, N, dv] with, per head, ``S_t = e^{g_t} S_{t-1} + k_t u_t^T``,
    ``u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t)``, ``o_t = S_t^T q_t``.

    Unrolled, with ``G`` the running sum of g: ``S_t = sum_{i<=t} e^{G_t - G_i} k_i u_i^T``, so
    ``u_t + beta_t sum_{i<t} e^{G_t - G_i} (k_t . k_i) u_i = beta_t v_t`` (a unit lower-triangular
    system for U) and ``o_t = sum_{i<=t} e^{G_t - G_i} (q_t . k_i) u_i``."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))          # [B, N, T, d]
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)         # [B, N, T]
    T = q.shape[2]
    G = g.cumsum(-1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    A = (beta[..., None] * decay * (k @ k.transpose(-1, -2))).tril(-1)
    u = torch.linalg.solve_triangular(A, beta[..., None] * v, upper=False, unitriangular=True)
    return ((decay * (q @ k.transpose(-1, -2))) @ u).transpose(1, 2)


def _gated_deltanet(P: dict, p: str, x: torch.Tensor, cfg) -> torch.Tensor:
    """Qwen3-Next's linear-attention mixer, no cache: x [B, T, H] -> [B, T, H]. ``in_proj_qkvz``
    rows are grouped per key head (q dk, k dk, v and z r * dv each, r = value heads per key
    head), ``in_proj_ba`` likewise (b r, a r); a causal depthwise conv + SiLU over (q, k, v)."""
    B, T, _ = x.shape
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, r = cfg.linear_key_head_dim, cfg.linear_value_head_dim, nv // nk
    q, k, v, z = (x @ P[p + "in_proj_qkvz.weight"].T).view(B, T, nk, -1).split(
        [dk, dk, r * dv, r * dv], dim=-1)
    b, a = (x @ P[p + "in_proj_ba.weight"].T).view(B, T, nk, 2 * r).split([r, r], dim=-1)
    mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], -1)
    w = P[p + "conv1d.weight"]
    mixed = F.conv1d(mixed.transpose(1, 2), w, padding=w.shape[-1] - 1, groups=w.shape[0])
    q, k, v = F.silu(mixed[..., :T]).transpose(1, 2).split([nk * dk, nk * dk, nv * dv], -1)
    q = _l2(q.reshape(B, T, nk, dk)).repeat_interleave(r, dim=2) / dk ** 0.5
    k = _l2(k.reshape(B, T, nk, dk)).repeat_interleave(r, dim=2)
    beta = b.reshape(B, T, nv).sigmoid()
    g = -P[p + "A_log"].exp() * F.softplus(a.reshape(B, T, nv) + P[p + "dt_bias"])
    o = delta_rule(q, k, v.reshape(B, T, nv, dv), g, beta)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)   # gated norm
    o = o * P[p + "norm.weight"] * F.silu(z.reshape(B, T, nv, dv))
    return o.reshape(B, T, nv * dv) @ P[p + "out_proj.weight"].T


def _rope_tables(cfg, T: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [T, rd] at positions 0..T-1 over the rotated part of a head (``rd`` =
    head_dim * partial_rotary_factor), halves laid out as ``rotate_half`` expects."""
    rope = cfg.rope_parameters
    rd = int(cfg.head_dim * rope.get("partial_rotary_factor", 1.0))
    inv_freq = rope["rope_theta"] ** -(torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first ``rd`` dims of x [B, T, N, D] (pairs i, i + rd/2); the rest passes."""
    rd = cos.shape[-1]
    xr, rest = x[..., :rd], x[..., rd:]
    x1, x2 = xr.chunk(2, dim=-1)
    cos, sin = cos[:, None], sin[:, None]
    return torch.cat([xr * cos + torch.cat([-x2, x1], dim=-1) * sin, rest], dim=-1)


def _gated_attention(P: dict, p: str, x: torch.Tensor, rope, cfg) -> torch.Tensor:
    """Qwen3-Next's full attention, causal over the T positions: x [B, T, H] -> [B, T, H].
    ``q_proj`` gives per head (query D, output gate D); q/k zero-centred RMSNorm per head, then
    partial RoPE; KV heads shared by consecutive query heads; output * sigmoid(gate)."""
    B, T, _ = x.shape
    Hq, Hkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, \
        cfg.rms_norm_eps
    q, gate = (x @ P[p + "q_proj.weight"].T).view(B, T, Hq, 2 * D).chunk(2, dim=-1)
    q = _rotate(_rms(q, P[p + "q_norm.weight"], eps), *rope)
    k = _rotate(_rms((x @ P[p + "k_proj.weight"].T).view(B, T, Hkv, D), P[p + "k_norm.weight"],
                     eps), *rope)
    v = (x @ P[p + "v_proj.weight"].T).view(B, T, Hkv, D)
    k, v = (t.repeat_interleave(Hq // Hkv, dim=2).transpose(1, 2) for t in (k, v))
    scores = q.transpose(1, 2) @ k.transpose(-1, -2) * D ** -0.5      # [B, Hq, T, T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    o = (scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v).transpose(1, 2)
    return (o.reshape(B, T, Hq * D) * gate.reshape(B, T, Hq * D).sigmoid()) \
        @ P[p + "o_proj.weight"].T


def _moe(P: dict, p: str, x: torch.Tensor, cfg) -> torch.Tensor:
    """Sparse MoE + gated shared expert: x [B, T, H] -> [B, T, H]. Router softmax, the top
    ``num_experts_per_tok`` weights (renormalised when ``norm_topk_prob``); every expert is
    evaluated on every token and weighted by 0 where not chosen (same values and gradients as
    routing, at this size cheaper)."""
    B, T, H = x.shape
    x = x.reshape(B * T, H)
    probs = (x @ P[p + "gate.weight"].T).softmax(-1)                 # [N, E]
    top, idx = probs.topk(cfg.num_experts_per_tok, dim=-1)
    if cfg.norm_topk_prob:
        top = top / top.sum(-1, keepdim=True)
    weights = torch.zeros_like(probs).scatter(1, idx, top)
    gate, up = torch.einsum("nh,eih->eni", x, P[p + "experts.gate_up_proj"]).chunk(2, dim=-1)
    routed = torch.einsum("ne,eni,ehi->nh", weights, F.silu(gate) * up,
                          P[p + "experts.down_proj"])
    s = p + "shared_expert."
    shared = (F.silu(x @ P[s + "gate_proj.weight"].T) * (x @ P[s + "up_proj.weight"].T)) \
        @ P[s + "down_proj.weight"].T
    shared = shared * (x @ P[p + "shared_expert_gate.weight"].T).sigmoid()
    return (routed + shared).view(B, T, H)


def _decoder_layer(P: dict, p: str, kind: str, x: torch.Tensor, rope, cfg) -> torch.Tensor:
    """Pre-norm residual layer ``x + mixer(norm(x))`` then ``+ moe(norm(.))``, [B, T, H]."""
    eps = cfg.rms_norm_eps
    h = _rms(x, P[p + "input_layernorm.weight"], eps)
    if kind == "linear_attention":
        h = _gated_deltanet(P, p + "linear_attn.", h, cfg)
    else:
        h = _gated_attention(P, p + "self_attn.", h, rope, cfg)
    x = x + h
    return x + _moe(P, p + "mlp.", _rms(x, P[p + "post_attention_layernorm.weight"], eps), cfg)


def twin_forward(P: dict, ids: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(next-token logits [B, T, V], MTP logits [B, T-1, V]; row t predicts x_{t+2}) of ids
    [B, T] int64, in the parameters' dtype: the MTP reads (h_t, x_{t+1}) at position t, causal
    over its own rows, h after the target's final norm (what ``forward_both`` computes with
    HF's modules)."""
    eps, T = cfg.rms_norm_eps, ids.shape[1]
    embed = P["model.embed_tokens.weight"]
    rope = _rope_tables(cfg, T, embed.dtype)
    x = embed[ids]
    for i, kind in enumerate(cfg.layer_types):
        x = _decoder_layer(P, f"model.layers.{i}.", kind, x, rope, cfg)
    h = _rms(x, P["model.norm.weight"], eps)
    e = _rms(embed[ids[:, 1:]], P["mtp.pre_fc_norm_embedding.weight"], eps)
    y = torch.cat([e, _rms(h[:, :-1], P["mtp.pre_fc_norm_hidden.weight"], eps)], -1) \
        @ P["mtp.fc.weight"].T
    y = _decoder_layer(P, "mtp.layers.0.", "full_attention", y,
                       tuple(t[: T - 1] for t in rope), cfg)
    y = _rms(y, P["mtp.norm.weight"], eps)
    lm_head = P["lm_head.weight"]
    return h @ lm_head.T, y @ lm_head.T


# ---- the MTP head, from HF modules ---------------------------------------------------------
class HFMTPHead(nn.Module):
    """Our ``Qwen3NextMTP`` written with HF modules, with the checkpoint's parameter names (the
    weights come from the training twin, ``to_hf`` / ``load_trained``).

    ``forward(embed, next_ids [B, T] int64, hidden [B, T, H] float32, rotary) -> y [B, T, H]``
    float32 (after ``norm``): row t is the pair (h_t, x_{t+1}) at RoPE position t, attention
    causal over rows 0..t. ``embed`` and ``rotary`` are the target's ``nn.Embedding`` and
    ``Qwen3NextRotaryEmbedding`` (shared, as in the checkpoint format).
    """

    def __init__(self, config):
        from transformers.models.qwen3_next import modeling_qwen3_next as hf

        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        # HF picks the mixer from layer_types[idx]: take a full-attention index. Its FFN is MoE,
        # as every layer's in CONFIG, which is also what our module's layer-0 rule builds.
        full = config.layer_types.index("full_attention")
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = hf.Qwen3NextRMSNorm(H, eps)
        self.pre_fc_norm_hidden = hf.Qwen3NextRMSNorm(H, eps)
        self.layer = hf.Qwen3NextDecoderLayer(config, full)
        self.norm = hf.Qwen3NextRMSNorm(H, eps)

    def forward(self, embed: nn.Embedding, next_ids: torch.Tensor, hidden: torch.Tensor,
                rotary) -> torch.Tensor:
        e = self.pre_fc_norm_embedding(embed(next_ids))
        x = self.fc(torch.cat([e, self.pre_fc_norm_hidden(hidden)], dim=-1))
        T = x.shape[1]
        pos = torch.arange(T).unsqueeze(0)
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]   # additive, causal
        x = self.layer(x, position_embeddings=rotary(x, pos), attention_mask=mask,
                       position_ids=pos)
        return self.norm(x)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The ``mtp.*`` tensors our loader expects (layer as ``mtp.layers.0.<HF name>``)."""
        out = {}
        for name, t in self.state_dict().items():
            key = "layers.0." + name[len("layer."):] if name.startswith("layer.") else name
            out["mtp." + key] = t.detach().clone()
        return out


def forward_both(model, head: HFMTPHead, ids: torch.Tensor):
    """(next-token logits [B, T, V], MTP logits [B, T-1, V]; row t predicts x_{t+2})."""
    out = model.model(input_ids=ids)
    h = out.last_hidden_state                       # after the final norm
    y = head(model.model.embed_tokens, ids[:, 1:], h[:, :-1], model.model.rotary_emb)
    return model.lm_head(h), model.lm_head(y)


@torch.no_grad()
def accuracies(model, head: HFMTPHead, ids: torch.Tensor, skip: int = 2) -> tuple[float, float]:
    """Greedy (next-token, next-next-token) accuracy on ``ids`` [B, T], teacher forced, over
    positions t >= ``skip`` (the step d is unknowable before two tokens)."""
    logits, mtp_logits = forward_both(model, head, ids)
    lm = (logits[:, skip:-1].argmax(-1) == ids[:, skip + 1:]).float().mean().item()
    mtp = (mtp_logits[:, skip:-1].argmax(-1) == ids[:, skip + 2:]).float().mean().item()
    return lm, mtp


# ---- training -------------------------------------------------------------------------------
def hf_config():
    """The ``Qwen3NextConfig`` of ``CONFIG`` (HF's defaults for the rest: RMSNorm eps 1e-6,
    RoPE theta 1e4 on a quarter of each head, top-k weights renormalised)."""
    from transformers import AutoConfig

    return AutoConfig.for_model("qwen3_next", **CONFIG)


def twin_losses(P: dict, ids: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(next-token CE, next-next-token CE over rows t = 0..T-3) of ids [B, T], scalars in the
    parameters' dtype."""
    logits, mtp_logits = twin_forward(P, ids, cfg)
    V = logits.shape[-1]
    lm = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    mtp = F.cross_entropy(mtp_logits[:, :-1].reshape(-1, V), ids[:, 2:].reshape(-1))
    return lm, mtp


def train(steps: int = TRAIN["steps"], log_every: int = 0) -> tuple[dict, dict]:
    """Train the twin (float32; target and MTP jointly; Adam, linear warm-up, grad-norm clip 1)
    on fresh batches of ``TRAIN["batch"]`` x ``TRAIN["seq_len"]`` tokens. Returns (parameters
    by checkpoint name, float32, detached; stats: wall seconds, last losses in nats)."""
    p, cfg = TRAIN, hf_config()
    P = init_params(cfg, p["seed"])
    params = list(P.values())
    opt = torch.optim.Adam(params, lr=p["lr"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / p["warmup"]))
    gen = torch.Generator().manual_seed(p["seed"])
    t0 = time.perf_counter()
    for step in range(steps):
        lm, mtp = twin_losses(P, sample_batch(gen, p["batch"], p["seq_len"]), cfg)
        opt.zero_grad()
        (lm + mtp).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if log_every and step % log_every == 0:
            print(f"step {step} lm {lm.item():.3f} mtp {mtp.item():.3f} "
                  f"{time.perf_counter() - t0:.1f}s", flush=True)
    stats = {"train_seconds": round(time.perf_counter() - t0, 1), "final_lm_loss": lm.item(),
             "final_mtp_loss": mtp.item()}
    return {n: t.detach() for n, t in P.items()}, stats


def to_hf(weights: dict[str, torch.Tensor]):
    """(HF ``Qwen3NextForCausalLM``, ``HFMTPHead``), float32, eval mode, holding ``weights``
    (checkpoint names, any float dtype; every tensor of both loaded, strictly)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_config(), dtype=torch.float32)
    head = HFMTPHead(model.config)
    sd = {n: t.to(torch.float32) for n, t in weights.items()}
    model.load_state_dict({n: t for n, t in sd.items() if not n.startswith("mtp.")})
    head.load_state_dict({("layer." + n[13:] if n.startswith("mtp.layers.0.") else n[4:]): t
                          for n, t in sd.items() if n.startswith("mtp.")})
    return model.eval(), head.eval()


# ---- greedy speculative decoding replayed with the training modules -------------------------
@torch.no_grad()
def _target(model, ids: list[int]) -> tuple[torch.Tensor, list[int]]:
    """The target's final hidden states [L, H] over ``ids`` and its greedy token per position."""
    h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    return h, model.lm_head(h).argmax(-1).tolist()


@torch.no_grad()
def _mtp_drafts(model, head: HFMTPHead, ids: list[int], h: torch.Tensor, n: int) -> list[int]:
    """``n`` chained greedy MTP drafts after ``ids`` (L tokens; ``h`` [>= L-1, H] the target's
    hidden states): step 1 reads the pairs (h_t, x_{t+1}) at t = 0..L-2; step s + 1 appends
    (y of step s, draft s) at position L - 2 + s."""
    embed, rotary = model.model.embed_tokens, model.model.rotary_emb
    toks, hid, drafts = list(ids[1:]), h[: len(ids) - 1], []
    for _ in range(n):
        y = head(embed, torch.tensor([toks]), hid[None], rotary)[0, -1:]
        drafts.append(model.lm_head(y)[0].argmax().item())
        toks.append(drafts[-1])
        hid = torch.cat([hid, y])
    return drafts


def replay_spec(model, head: HFMTPHead, prompt: list[int], max_tokens: int, k: int,
                eos: int = 1) -> tuple[list[int], list[tuple[int, int]]]:
    """What our engine should do for one greedy request with MTP drafting (k steps, adaptive
    off, draft budget ``min(k, max_tokens - generated - 1)`` as ``Sequence.room_for_drafts``),
    recomputed without any cache with HF modules. Returns (generated token ids,
    [(drafts, accepted)] per verify step)."""
    ids = list(prompt)
    h, g = _target(model, ids)
    ids.append(g[-1])
    out, steps = [g[-1]], []
    while len(out) < max_tokens and out[-1] != eos:
        n = min(k, max_tokens - len(out) - 1)
        drafts = _mtp_drafts(model, head, ids, h, n)   # h covers positions 0..len(ids)-2
        h, g = _target(model, ids + drafts)
        greedy = g[len(ids) - 1:]
        a = 0
        while a < n and drafts[a] == greedy[a]:
            a += 1
        if n:
            steps.append((n, a))
        for t in greedy[: a + 1]:
            ids.append(t)
            out.append(t)
            if len(out) == max_tokens or t == eos:
                break
    return out, steps


# ---- export, cache ---------------------------------------------------------------------------
def training_cpu_capability() -> str:
    """``ATEN_CPU_CAPABILITY`` of the training process: ATen's vectorised kernels (reductions,
    exp / log) round differently in their AVX2 and AVX-512 builds, and training grows that into
    other weights (in float64 too), so an x86 CPU with AVX2 or AVX-512 trains with the AVX2
    kernels; any other CPU with torch's choice (lower case, e.g. "default"). MKL's and oneDNN's
    AVX2 paths trained the same weights as their AVX-512 ones; the training process keeps to AVX2
    there as well."""
    cap = torch.backends.cpu.get_cpu_capability()
    return "avx2" if cap in ("AVX2", "AVX512") else cap.lower()


def cache_key() -> dict:
    """Everything the checkpoint depends on: this file's and the checkpoint writer's text, the
    config, the training settings, torch's version and the CPU kernels it trains with; and
    transformers' version, for the files HF writes (the weights do not depend on it)."""
    import transformers

    here = Path(__file__).parent
    texts = "".join((here / f).read_text() for f in ("trained_hybrid.py", "hybrid_checkpoint.py"))
    return {"code": hashlib.sha256(texts.encode()).hexdigest(), "config": CONFIG,
            "train": TRAIN, "torch": torch.__version__,
            "cpu_capability": training_cpu_capability(),
            "transformers": transformers.__version__}


def cache_dir(key: dict) -> Path:
    """``<cache root>/fixtures/trained-hybrid-<16 hex digits of the key's sha256>``."""
    from mtpserve.loader.cache import cache_root

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "fixtures" / f"trained-hybrid-{digest}"


def weights_digest(weights: dict[str, torch.Tensor]) -> str:
    """sha256 of the float32 weights' bytes in name order (equal digests: equal checkpoints)."""
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(weights[name].to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def build(path: Path) -> dict:
    """Train (in this process), write the checkpoint into ``path`` and return the training
    record: time, final losses, teacher-forced accuracies on held-out sequences through HF's
    modules, the largest difference of their logits from the twin's, the weights' digest."""
    with one_thread():
        weights, stats = train()
        model, head = to_hf(weights)
        held = sample_batch(torch.Generator().manual_seed(4321), 64, TRAIN["seq_len"])
        stats["heldout_next_token_acc"], stats["heldout_mtp_acc"] = accuracies(model, head, held)
        with torch.no_grad():
            diff = max((a.double() - b).abs().max().item() for a, b in
                       zip(forward_both(model, head, held), twin_forward(weights, held,
                                                                         hf_config())))
    stats["twin_hf_max_logit_diff"] = diff
    stats["weights_sha256"] = weights_digest(weights)
    if not stats["heldout_next_token_acc"] >= 0.98:     # never cache a model that did not learn
        raise RuntimeError(f"the tiny hybrid did not learn the corpus: {stats}")
    if not diff < 1e-3:   # the twin's reading of the checkpoint is not HF's
        raise RuntimeError(f"the training twin and HF's modules disagree: {stats}")
    write_checkpoint(path, model, head.checkpoint_tensors())
    return stats


def build_in_subprocess(path: Path) -> dict:
    """``build(path)`` in a fresh Python (this file as a script) whose ATen kernels are
    ``training_cpu_capability()``'s: a process picks them once, at its first operator."""
    cap = training_cpu_capability()
    env = {**os.environ, "ATEN_CPU_CAPABILITY": cap, "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    if cap == "avx2":
        env.update(MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2")
    run = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(path)], env=env,
                         capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"training the tiny hybrid failed:\n{run.stderr[-4000:]}")
    return json.loads((path / MARKER).read_text())["stats"]


def trained_hybrid_dir() -> Path:
    """The cached checkpoint directory (trained on first use; ~40 s on one core)."""
    key = cache_key()
    final = cache_dir(key)
    if (final / MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-" + final.name + "-", dir=final.parent))
    try:
        stats = build_in_subprocess(tmp)
        (tmp / MARKER).write_text(json.dumps({"key": key, "stats": stats}, indent=1))
        os.rename(tmp, final)
    except OSError:
        if not (final / MARKER).is_file():   # not another process winning the rename
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_trained(path: Path):
    """(HF model, HFMTPHead) from a checkpoint directory, float32, eval mode."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    head = HFMTPHead(model.config)
    sd = {n[len("mtp."):]: t for n, t in load_file(str(path / "model.safetensors")).items()
          if n.startswith("mtp.")}
    sd = {("layer." + n[len("layers.0."):] if n.startswith("layers.0.") else n): t
          for n, t in sd.items()}
    head.load_state_dict(sd)
    return model, head.eval()


if __name__ == "__main__":    # build_in_subprocess: python trained_hybrid.py DIR
    out = Path(sys.argv[1])
    (out / MARKER).write_text(json.dumps({"stats": build(out)}, indent=1))
