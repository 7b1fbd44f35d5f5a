"""Gated delta rule and short causal convolution, plain-PyTorch reference (CPU path, test oracle).

The Gated DeltaNet recurrence (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks: Improving
Mamba2 with Delta Rule", eq. 10), per value head, with state S [Dk, Dv], for each token t:

    S <- exp(g_t) * S                          (gated decay, g_t <= 0)
    u_t = beta_t * (v_t - S^T k_t)             (delta rule: write only what S mispredicts)
    S <- S + k_t u_t^T
    o_t = S^T q_t

with q and k L2-normalised per head and q scaled by Dk ** -0.5 (Qwen3-Next, as in
flash-linear-attention's ``use_qk_l2norm_in_kernel``). Two equivalent forms:

- :func:`recurrent_gated_delta_rule` steps token by token over a padded batch and can return the
  state after every token (decode and speculative verify need exactly that);
- :func:`chunk_gated_delta_rule` processes one sequence in chunks of 64 tokens: inside a chunk the
  delta-rule updates are folded into one unit-lower-triangular solve (the WY / UT representation,
  Yang et al. 2024 "Parallelizing Linear Transformers with the Delta Rule over Sequence Length",
  sec. 3), and the state is carried from chunk to chunk (prefill).

All maths runs in float32; states are float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension (flash-linear-attention's form)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q: torch.Tensor, k: torch.Tensor, num_v_heads: int):
    """float32, key heads repeated for their value heads (GVA), L2-normalised, q scaled."""
    rep = num_v_heads // k.shape[-2]
    q, k = q.float(), k.float()
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=-2), k.repeat_interleave(rep, dim=-2)
    q, k = l2norm(q), l2norm(k)
    return q * q.shape[-1] ** -0.5, k


def recurrent_gated_delta_rule(q, k, v, g, beta, state, keep_states: bool = False):
    """Token-by-token gated delta rule over a batch of equally long (padded) sequences.

    Args:
        q, k: [B, T, Hk, Dk]; v: [B, T, Hv, Dv] (Hv a multiple of Hk); g (log decay), beta:
            [B, T, Hv]; state: [B, Hv, Dk, Dv] initial state. Padding tokens must have
            ``beta = 0`` and ``g = 0``: they then leave the state unchanged.
        keep_states: also return the state after every token.

    Returns:
        (out [B, T, Hv, Dv] float32, final state [B, Hv, Dk, Dv] float32,
        states [B, T, Hv, Dk, Dv] float32 or None).
    """
    q, k = _prepare(q, k, v.shape[-2])
    v, g, beta = v.float(), g.float(), beta.float()
    s = state.float().clone()
    decay = g.exp()
    outs, states = [], []
    for t in range(q.shape[1]):
        s = s * decay[:, t, :, None, None]
        kt = k[:, t]
        u = (v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, s)) * beta[:, t, :, None]
        s = s + kt.unsqueeze(-1) * u.unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], s))
        if keep_states:
            states.append(s)
    return torch.stack(outs, 1), s, (torch.stack(states, 1) if keep_states else None)


def chunk_gated_delta_rule(q, k, v, g, beta, state, chunk: int = CHUNK):
    """Chunked gated delta rule over ONE sequence.

    Args:
        q, k: [T, Hk, Dk]; v: [T, Hv, Dv]; g, beta: [T, Hv]; state: [Hv, Dk, Dv] initial state.

    Returns:
        (out [T, Hv, Dv] float32, final state [Hv, Dk, Dv] float32).

    Within a chunk with cumulative log decay c_i, the corrected values U solve
    ``(I + A) U = beta*V - (beta*exp(c)*K) S0`` where ``A[i, j] = beta_i exp(c_i - c_j) k_i.k_j``
    for j < i; outputs are ``exp(c_i) S0^T q_i + sum_{j<=i} exp(c_i - c_j) (q_i.k_j) u_j`` and the
    state leaving the chunk is ``exp(c_last) S0 + sum_j exp(c_last - c_j) k_j u_j^T``.
    """
    T = q.shape[0]
    q, k = _prepare(q, k, v.shape[-2])
    pad = (-T) % chunk
    # [H, N, C, D] per chunk; padding (beta = 0, g = 0, zero vectors) leaves the state unchanged
    q, k, v = (F.pad(x.transpose(0, 1), (0, 0, 0, pad)).unflatten(1, (-1, chunk))
               for x in (q, k, v.float()))
    g, beta = (F.pad(x.float().transpose(0, 1), (0, pad)).unflatten(1, (-1, chunk))
               for x in (g, beta))
    c = g.cumsum(-1)                                                   # [H, N, C]
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    rel = (c.unsqueeze(-1) - c.unsqueeze(-2)).masked_fill(~lower, -torch.inf).exp()  # [H,N,C,C]
    kb = k * beta.unsqueeze(-1)
    a = (kb @ k.transpose(-1, -2)) * rel
    t_mat = a.tril(-1) + torch.eye(chunk, dtype=a.dtype, device=a.device)
    u0 = torch.linalg.solve_triangular(t_mat, v * beta.unsqueeze(-1), upper=False,
                                       unitriangular=True)
    w = torch.linalg.solve_triangular(t_mat, kb * c.exp().unsqueeze(-1), upper=False,
                                      unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * rel
    q_dec = q * c.exp().unsqueeze(-1)
    k_dec = k * (c[..., -1:] - c).exp().unsqueeze(-1)
    last = c[..., -1].exp()[..., None, None]                           # [H, N, 1, 1]
    s = state.float()
    out = torch.empty_like(u0)
    for n in range(q.shape[1]):
        u = u0[:, n] - w[:, n] @ s
        out[:, n] = q_dec[:, n] @ s + attn[:, n] @ u
        s = s * last[:, n] + k_dec[:, n].transpose(-1, -2) @ u
    return out.flatten(1, 2)[:, :T].transpose(0, 1), s


def causal_conv1d(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None):
    """Depthwise causal convolution with SiLU, continuing from a conv state.

    Args:
        x: [B, T, C] new inputs; state: [B, C, K-1] the previous K-1 inputs in time order (zeros
            for a fresh sequence); weight: [C, K]; bias: [C] or None.

    Returns:
        (out [B, T, C] in x's dtype, window [B, K-1+T, C]: the state followed by x, from which
        the conv state after token t is ``window[:, t+1 : t+K]`` — see :func:`conv_states`).
    """
    window = torch.cat([state.transpose(1, 2).to(x.dtype), x], dim=1)
    out = F.conv1d(window.transpose(1, 2), weight.unsqueeze(1).to(x.dtype), bias,
                   groups=weight.shape[0])
    return F.silu(out).transpose(1, 2), window


def conv_states(window: torch.Tensor, kernel: int) -> torch.Tensor:
    """The conv state after each token: [B, T, C, K-1] (a strided view of ``window``)."""
    return window.unfold(1, kernel - 1, 1)[:, 1:]
