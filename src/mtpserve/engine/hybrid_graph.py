"""CUDA graphs for decode and verify steps of hybrid (Gated DeltaNet + attention) models.

A hybrid layer's recurrent-state path (layers/linear_attention.py) runs a batch of sequences as
one padded block [B, q]; its host-side plan (which sequence reads which state slot, which scratch
row takes the per-token states) is fixed per step shape. So graphs here are captured per
(number of sequences B, query length q) for uniform steps: every sequence decodes one token
(q = 1, no scratch), or every sequence verifies the same number of drafts q - 1 and writes its
per-token states to scratch rows 0..B-1 (the order model_runner assigns them). q runs over
1..1+k so that an adaptive draft length still replays a graph at batch 1; B climbs a ladder up to
``max_num_seqs``. Padding sequences read and write the state cache's reserved ``pad_slot`` and
the KV cache's pad slot; their outputs are dropped. Other steps (prefill, mixed query lengths)
run eagerly.
"""

from __future__ import annotations

import torch

from mtpserve.engine.cuda_graph import SIZES, CudaGraphRunner
from mtpserve.engine.forward_batch import ForwardBatch
from mtpserve.engine.state_cache import LinearAttnMetadata
from mtpserve.kernels.paged_attention import TritonAttentionMetadata
from mtpserve.layers.linear_attention import RecurrentPlan


class HybridGraphRunner(CudaGraphRunner):
    """Graphs keyed by (B, q) for uniform decode / verify steps of a hybrid model.

    Args:
        runner: the ModelRunner (with its ``state_cache``); max_tokens: most tokens in a graph;
        max_drafts: k (0: decode graphs only); the rest as :class:`CudaGraphRunner`.
    """

    def __init__(self, runner, max_tokens: int, max_drafts: int, max_seqs: int,
                 max_blocks: int, part_size: int):
        super().__init__(runner, (), max_seqs, max_blocks, part_size)
        ladder = [b for b in SIZES if b < max_seqs] + [max_seqs]
        self._keys = sorted(((b, q) for q in range(1, max_drafts + 2) for b in ladder
                             if b * q <= max(max_tokens, q)), key=lambda k: (k[0] * k[1], k))
        self.sizes = sorted({b * q for b, q in self._keys})

    def keys(self) -> list:
        return list(self._keys)

    @staticmethod
    def tokens(key) -> int:
        return key[0] * key[1]

    def _static_batch(self, key) -> ForwardBatch:
        B, q = key
        T, dev, i64, i32 = B * q, self.runner.device, torch.int64, torch.int32
        cache = self.runner.state_cache
        tables = torch.zeros(B, self.max_blocks, dtype=i32, device=dev)
        rows = torch.arange(B, dtype=i32, device=dev).repeat_interleave(q)
        attn = TritonAttentionMetadata(rows, torch.ones(T, dtype=i32, device=dev), tables,
                                       self.runner.block_size, self.part_size)
        batch = ForwardBatch(
            input_ids=torch.zeros(T, dtype=i64, device=dev),
            positions=torch.zeros(T, dtype=i64, device=dev),
            slot_mapping=torch.full((T,), self.runner.pad_slot, dtype=i64, device=dev),
            query_start_loc=torch.arange(0, T + 1, q, dtype=i32, device=dev),
            query_lens=torch.full((B,), q, dtype=i64, device=dev),
            seq_lens=torch.ones(B, dtype=i64, device=dev), block_tables=tables,
            logits_indices=torch.arange(T, dtype=i64, device=dev),
            query_lens_cpu=[q] * B, seq_lens_cpu=[1] * B, attn=attn)
        batch.kv_caches = self.runner.kv_cache.layers
        slots = torch.full((B,), cache.pad_slot, dtype=i64, device=dev)
        batch.extra["linear_attn"] = LinearAttnMetadata(cache, slots, [cache.pad_slot] * B,
                                                        [-1] * B)
        batch.extra["gdn_plan"] = RecurrentPlan(
            token_index=None, pad_index=None, num_small=B, max_q=q,
            last=torch.full((B,), q - 1, dtype=i64, device=dev), slots=slots, scratch=[],
            large=[], scratch_rows=torch.arange(B, dtype=i64, device=dev) if q > 1 else None)
        return batch

    def _key_for(self, batch: ForwardBatch):
        """The graph key a step replays, or None when it must run eagerly."""
        qlens, meta = batch.query_lens_cpu, batch.extra.get("linear_attn")
        if meta is None or not isinstance(batch.attn, TritonAttentionMetadata) or not qlens:
            return None
        q, B = qlens[0], len(qlens)
        if any(x != q for x in qlens) or batch.block_tables.shape[1] > self.max_blocks:
            return None
        verify = list(range(B)) if q > 1 else [-1] * B
        if meta.scratch_rows != verify:       # a short prefill chunk, or mixed drafts
            return None
        return next((k for k in self._keys if k[1] == q and k[0] >= B), None)

    def can_run(self, batch: ForwardBatch) -> bool:
        return bool(self.graphs) and self._key_for(batch) in self.graphs

    def run(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the graph of (smallest B that fits, q); return (hidden [T, H], logits [N, V])."""
        T, B = batch.num_tokens, batch.num_seqs
        g = self.graphs[self._key_for(batch)]
        s = g.batch
        s.input_ids[:T].copy_(batch.input_ids)
        s.positions[:T].copy_(batch.positions)
        s.slot_mapping[:T].copy_(batch.slot_mapping)
        s.slot_mapping[T:].fill_(self.runner.pad_slot)
        s.attn.kv_len[:T].copy_(batch.attn.kv_len)
        s.attn.kv_len[T:].fill_(1)
        s.block_tables[:B, : batch.block_tables.shape[1]].copy_(batch.block_tables)
        slots = s.extra["linear_attn"].slots
        slots[:B].copy_(batch.extra["linear_attn"].slots)
        slots[B:].fill_(self.runner.state_cache.pad_slot)
        g.graph.replay()
        return g.hidden[:T], g.logits[batch.logits_indices]
