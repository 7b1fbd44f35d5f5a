"""Gated full attention of Qwen3-Next / Qwen3.5 (the "Gated Attention" of the Qwen3-Next notes).

Per layer: q_proj is twice as wide, giving each query head a query half and a gate half
(laid out per head: [q_h (D) | gate_h (D)]); per-head zero-centred RMSNorm on q and k
(``x * (1 + w)``); RoPE on the first ``partial_rotary_factor * head_dim`` channels of each head;
GQA attention over the paged KV cache; the output is multiplied by ``sigmoid(gate)`` before
o_proj (Qiu et al. 2025, "Gated Attention for Large Language Models"). Text-only serving uses
plain 1-D RoPE: Qwen3.5's multimodal mrope gives every section the same position for text.
"""

from __future__ import annotations

import torch
from torch import nn

from mtpserve.config import ModelConfig
from mtpserve.engine.forward_batch import ForwardBatch
from mtpserve.kernels.dispatch import use_triton
from mtpserve.layers.attention import Attention
from mtpserve.layers.linear import QKVParallelLinear, RowParallelLinear
from mtpserve.layers.norm import RMSNorm
from mtpserve.layers.rotary import RotaryEmbedding, _rope_parameters


# off: CUDA takes the unfused path (the q/k norm and RoPE kernels, Attention.forward's K/V
# write, PyTorch's gate copy, sigmoid and product), for benchmarks/gpu_decode.py --compare
FUSED = True


def rotary_dim(cfg: ModelConfig) -> int:
    """Channels of each head that RoPE rotates: ``int(head_dim * partial_rotary_factor)``."""
    hf = cfg.hf_config
    factor = _rope_parameters(hf).get("partial_rotary_factor",
                                      getattr(hf, "partial_rotary_factor", 1.0))
    return int(cfg.head_dim * factor)


class GatedAttention(nn.Module):
    """Output-gated GQA self-attention: ``forward(rope, x [T, H], batch) -> [T, H]``.

    ``attn_idx`` is the index of this layer's KV cache in ``batch.kv_caches`` (counting only
    full-attention layers). Checkpoint names: ``q_proj`` [2 * Hq * D, H], ``k_proj``, ``v_proj``,
    ``o_proj``, ``q_norm`` [D], ``k_norm`` [D].

    Raises:
        ValueError: for a config with ``attn_output_gate: false`` (no such checkpoint is known).
    """

    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, attn_idx: int):
        super().__init__()
        if not getattr(cfg.hf_config, "attn_output_gate", True):
            raise ValueError("attn_output_gate: false is not supported (Qwen3-Next and Qwen3.5 "
                             "always gate the attention output)")
        D = self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, D, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, bias=cfg.attention_bias,
                                          q_size_factor=2)
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * D, cfg.hidden_size,
                                        bias=cfg.attention_bias)
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.q_norm = RMSNorm(D, cfg.rms_norm_eps, zero_centered=True)
        self.k_norm = RMSNorm(D, cfg.rms_norm_eps, zero_centered=True)
        self.rotary = rotary
        self.attn = Attention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, D, D ** -0.5,
                              attn_idx)

    def forward(self, rope, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """``x`` [T, H] (normed) -> [T, H]; ``rope`` from ``RotaryEmbedding.lookup``. Writes
        this step's K/V into the layer's cache in ``batch``."""
        qkv = self.qkv_proj(x)
        if FUSED and use_triton(qkv):
            return self.o_proj(self._fused_attend(qkv, rope[2], batch))
        T, nq, D = x.shape[0], self.attn.num_heads, self.head_dim
        q_gate = qkv[:, : self.q_size].view(T, nq, 2 * D)
        gate = q_gate[..., D:].reshape(T, nq * D)
        k = qkv[:, self.q_size: self.q_size + self.kv_size].view(T, -1, D)
        v = qkv[:, self.q_size + self.kv_size:]
        qk = torch.cat([self.q_norm(q_gate[..., :D]), self.k_norm(k)], dim=1)
        qk = self.rotary.apply(qk, rope)   # queries and keys rotated together
        out = self.attn(qk[:, :nq], qk[:, nq:], v, batch)
        return self.o_proj(out * torch.sigmoid(gate))

    def _fused_attend(self, qkv: torch.Tensor, positions: torch.Tensor,
                      batch: ForwardBatch) -> torch.Tensor:
        """CUDA: the q/k norms, the partial RoPE and the K/V write in one kernel (queries read
        in place, 2D apart past their gates), attention, then the output gate in one kernel
        (the gate read in place): 3 launches where the reference path's ops take ~10.
        ``qkv`` [T, Hq * 2D + 2 Hkv D]; returns the gated attention output [T, Hq * D]."""
        from mtpserve.kernels import fused_triton
        from mtpserve.kernels.output_gate_triton import output_gate_

        T, nq, D = qkv.shape[0], self.attn.num_heads, self.head_dim
        k_cache, v_cache = self.attn.kv_cache(batch)
        q = fused_triton.qk_norm_rope_kv_write(
            qkv, nq, self.attn.num_kv_heads, D, positions, self.rotary.cos,
            self.rotary.signed_sin, k_cache, v_cache, batch.slot_mapping,
            q_weight=self.q_norm.weight, k_weight=self.k_norm.weight, eps=self.q_norm.eps,
            zero_centered=True, q_head_stride=2 * D)
        gate = qkv[:, : self.q_size].view(T, nq, 2 * D)[..., D:]
        return output_gate_(self.attn.attend(q, batch).contiguous(), gate)
