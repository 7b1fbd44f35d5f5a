"""Attention over the paged KV cache: writes this step's K/V (unless a fused kernel did), then
attends."""

from __future__ import annotations

import torch
from torch import nn

from mtpserve.engine.forward_batch import ForwardBatch
from mtpserve.kernels.dispatch import use_triton
from mtpserve.kernels.paged_attention import (TritonAttentionMetadata, paged_attention_ref,
                                              per_token_attention_ref, write_kv)


class Attention(nn.Module):
    """Multi-head / grouped-query attention of one layer against its KV cache.

    The caches come with the batch: ``batch.kv_caches[layer_idx]`` is this layer's (K, V), each
    [num_slots, num_kv_heads, head_dim] (slots = blocks x block_size), so one model can run over
    several KV pools (the target's, and a self-drafting proposer's). ``forward(q, k, v, batch)``
    takes q as [T, Hq, D] or [T, Hq*D] and k, v as [T, Hkv, D] or [T, Hkv*D] (views are fine),
    writes k, v at ``batch.slot_mapping`` and attends; it returns [T, Hq*D]. A caller that has
    already written this step's K/V itself (a fused kernel, ``kv_cache(batch)`` gives the
    tensors) calls ``attend(q, batch)`` instead.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 layer_idx: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.layer_idx = layer_idx

    def kv_cache(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's (K, V) cache tensors in ``batch``'s pool, each [num_slots, Hkv, D]."""
        return batch.kv_caches[self.layer_idx]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                batch: ForwardBatch) -> torch.Tensor:
        T = q.shape[0]
        k = k.reshape(T, self.num_kv_heads, self.head_dim)
        v = v.reshape(T, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = self.kv_cache(batch)
        write_kv(k_cache, v_cache, k, v, batch.slot_mapping)
        return self.attend(q, batch)

    def attend(self, q: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Attention of ``q`` ([T, Hq, D] or [T, Hq*D]) over the cache, which must already hold
        this step's K/V at ``batch.slot_mapping``; returns [T, Hq*D] in q's dtype."""
        T = q.shape[0]
        q = q.reshape(T, self.num_heads, self.head_dim)
        k_cache, v_cache = self.kv_cache(batch)
        m = batch.attn
        if isinstance(m, TritonAttentionMetadata) and use_triton(q):
            from mtpserve.kernels.paged_attention_triton import paged_attention_triton

            out = paged_attention_triton(q, k_cache, v_cache, m.block_tables, m.table_row,
                                         m.kv_len, self.scale, m.block_size, m.part_size)
        elif isinstance(m, TritonAttentionMetadata):
            out = per_token_attention_ref(q, k_cache, v_cache, m, self.scale)
        else:
            out = paged_attention_ref(q, k_cache, v_cache, m, self.scale)
        return out.reshape(T, self.num_heads * self.head_dim)
