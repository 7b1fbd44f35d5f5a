"""Attention over the paged KV cache: writes this step's K/V, then attends."""

from __future__ import annotations

import torch
from torch import nn

from mtpserve.engine.forward_batch import ForwardBatch
from mtpserve.kernels.paged_attention import paged_attention_ref, write_kv


class Attention(nn.Module):
    """Multi-head / grouped-query attention of one layer against its KV cache.

    ``k_cache`` / ``v_cache`` ([num_slots, num_kv_heads, head_dim], slots = blocks x block_size)
    are bound by the model runner after it sizes the cache. ``forward(q [T, Hq*D], k [T, Hkv*D],
    v [T, Hkv*D], batch)`` returns [T, Hq*D].
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                batch: ForwardBatch) -> torch.Tensor:
        T = q.shape[0]
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        write_kv(self.k_cache, self.v_cache, k, v, batch.slot_mapping)
        out = paged_attention_ref(q, self.k_cache, self.v_cache, batch.attn, self.scale)
        return out.reshape(T, self.num_heads * self.head_dim)
