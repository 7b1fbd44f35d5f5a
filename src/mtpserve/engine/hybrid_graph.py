"""CUDA graphs for decode and verify steps of hybrid (Gated DeltaNet + attention) models.

A hybrid layer's recurrent-state path (layers/linear_attention.py) runs a batch of sequences as
one padded block [B, q]. Graphs here are captured per (number of sequences B, query length Q)
with that block fixed: every sequence of a step takes Q rows, its real tokens first (its newest
token and its drafts, 1 <= q_b <= Q), then padding. Padding tokens get ``g = beta = 0`` (the SSM
state stays as after the last real token), the conv state is read at each sequence's last real
token, their K/V goes to the KV cache's pad slot and their outputs are dropped. Sequences that
verify drafts write their per-token states to their scratch row; the others to the state cache's
pad scratch row. Q runs over 1..1+k, so a step where sequences draft different numbers of
tokens (adaptive draft length, n-gram misses) still replays a graph; B climbs a ladder up to
``max_num_seqs``; padding sequences use the state cache's ``pad_slot``. Steps with a prefill
chunk run eagerly.
"""

from __future__ import annotations

import torch

from mtpserve.engine.cuda_graph import SIZES, CudaGraphRunner
from mtpserve.engine.forward_batch import ForwardBatch, to_device, to_device_into
from mtpserve.engine.graph_inputs import write_tables
from mtpserve.engine.state_cache import LinearAttnMetadata
from mtpserve.kernels.argmax_triton import row_argmax
from mtpserve.kernels.paged_attention import TritonAttentionMetadata
from mtpserve.layers.linear_attention import RecurrentPlan
from mtpserve.spec.draft_ahead import uniform_acceptance


class HybridGraphRunner(CudaGraphRunner):
    """Graphs keyed by (B, q) for uniform decode / verify steps of a hybrid model.

    Args:
        runner: the ModelRunner (with its ``state_cache``); max_tokens: most tokens in a graph;
        max_drafts: k (0: decode graphs only); acceptance: verify graphs also decide their
        greedy acceptance (:meth:`_forward`; for the MTP proposer, whose ``verify_ahead``
        reads it); the rest as :class:`CudaGraphRunner`.
    """

    def __init__(self, runner, max_tokens: int, max_drafts: int, max_seqs: int,
                 max_blocks: int, part_size: int, acceptance: bool = False):
        super().__init__(runner, (), max_seqs, max_blocks, part_size)
        self.acceptance = acceptance
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
        token_io = torch.zeros(3 * T, dtype=i64, device=dev)   # ids, positions, KV slots
        token_io[2 * T:] = self.runner.pad_slot
        batch = ForwardBatch(
            input_ids=token_io[:T], positions=token_io[T:2 * T], slot_mapping=token_io[2 * T:],
            token_io=token_io, query_start_loc=torch.arange(0, T + 1, q, dtype=i32, device=dev),
            query_lens=torch.full((B,), q, dtype=i64, device=dev),
            seq_lens=torch.ones(B, dtype=i64, device=dev), block_tables=tables,
            logits_indices=torch.arange(T, dtype=i64, device=dev),
            query_lens_cpu=[q] * B, seq_lens_cpu=[1] * B, attn=attn)
        batch.kv_caches = self.runner.kv_cache.layers
        slots = torch.full((B,), cache.pad_slot, dtype=i64, device=dev)
        batch.extra["linear_attn"] = LinearAttnMetadata(cache, slots, [cache.pad_slot] * B,
                                                        [-1] * B)
        verify = q > 1
        batch.extra["gdn_plan"] = RecurrentPlan(
            token_index=None, pad_index=None, num_small=B, max_q=q,
            last=torch.full((B,), q - 1, dtype=i64, device=dev), slots=slots, scratch=[],
            large=[],
            scratch_rows=(torch.full((B,), cache.pad_scratch_row, dtype=i64, device=dev)
                          if verify else None),
            token_mask=torch.ones(T, dtype=torch.float32, device=dev) if verify else None)
        return batch

    def _forward(self, batch: ForwardBatch):
        """The captured forward; a verify graph (Q > 1, with ``acceptance``) also decides its
        greedy acceptance for its B sequences of Q - 1 drafts each (spec/draft_ahead.py
        ``uniform_acceptance``): ``batch.extra["acceptance"]`` = [T + B] int64, the argmax at
        every token, then the drafts accepted per sequence (so an all-greedy verify step
        launches none of it)."""
        hidden, logits = super()._forward(batch)
        B, Q = len(batch.query_lens_cpu), batch.query_lens_cpu[0]
        if Q > 1 and self.acceptance:
            T = B * Q
            out = torch.empty(T + B, dtype=torch.int64, device=logits.device)
            row_argmax(logits, out=out[:T])
            uniform_acceptance(batch.input_ids, out[:T], B, Q - 1, out=out[T:])
            batch.extra["acceptance"] = out
        return hidden, logits

    def _key_for(self, batch: ForwardBatch):
        """The graph key a step replays, or None when it must run eagerly."""
        qlens, meta = batch.query_lens_cpu, batch.extra.get("linear_attn")
        if meta is None or not isinstance(batch.attn, TritonAttentionMetadata) or not qlens:
            return None
        if batch.block_tables.shape[1] > self.max_blocks:
            return None
        if any(q > 1 and r < 0 for q, r in zip(qlens, meta.scratch_rows)):
            return None                       # a prefill chunk
        Q, B = max(qlens), len(qlens)
        return next((k for k in self._keys if k[1] == Q and k[0] >= B), None)

    def can_run(self, batch: ForwardBatch) -> bool:
        return bool(self.graphs) and self._key_for(batch) in self.graphs

    def run(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Scatter the step into the padded block of the graph (smallest B that fits, Q = the
        longest query), replay, gather; return (hidden [T, H], logits [N, V])."""
        key = self._key_for(batch)
        g, (Bg, Q) = self.graphs[key], key
        s, meta = g.batch, batch.extra["linear_attn"]
        B = len(batch.query_lens_cpu)
        full = B == Bg and all(q == Q for q in batch.query_lens_cpu)
        if full:
            self._fill_full(g, batch, key)
        else:
            where_t = self._fill_padded(g, batch, key)
        write_tables(self.written, key, s.block_tables, batch)
        slots = meta.slots_cpu + [self.runner.state_cache.pad_slot] * (Bg - B)
        static = s.extra["linear_attn"].slots
        if self.written.stale(key, "slots", slots):
            to_device_into(static, slots)
        meta.adopt_slots(static if B == Bg else static[:B])
        g.graph.replay()
        if full:   # the block is the batch: copies, not views of the graph's outputs
            if "acceptance" in s.extra:   # used before the next replay: queued ahead of it
                batch.extra["acceptance"] = s.extra["acceptance"]
            # every token a logits row (a verify step): the indices are 0..T-1
            every = batch.logits_indices.shape[0] == batch.num_tokens
            return g.hidden.clone(), (g.logits.clone() if every
                                      else g.logits[batch.logits_indices])
        return g.hidden[where_t], g.logits[where_t[batch.logits_indices]]

    def _scratch_rows(self, batch: ForwardBatch, Bg: int) -> list[int]:
        pad_row = self.runner.state_cache.pad_scratch_row
        rows = batch.extra["linear_attn"].scratch_rows
        return [r if r >= 0 else pad_row for r in rows] + [pad_row] * (Bg - len(rows))

    def _fill_full(self, g, batch: ForwardBatch, key) -> None:
        """Inputs of a step that fills the graph's block (every sequence Q tokens): straight
        copies (ids, positions and KV slots in one when ``batch`` has them back to back); the
        last-token index, token mask and scratch rows only when they do not hold this step's
        values already (engine/graph_inputs.py)."""
        s, plan, Q = g.batch, g.batch.extra["gdn_plan"], key[1]
        if batch.token_io is not None:
            s.token_io.copy_(batch.token_io)
        else:
            for buf, src in ((s.input_ids, batch.input_ids), (s.positions, batch.positions),
                             (s.slot_mapping, batch.slot_mapping)):
                buf.copy_(src)
        s.attn.kv_len.copy_(batch.attn.kv_len)
        if self.written.stale(key, "layout", "full"):
            plan.last.fill_(Q - 1)
            if plan.token_mask is not None:
                plan.token_mask.fill_(1.0)
        rows = self._scratch_rows(batch, len(batch.query_lens_cpu))
        if plan.token_mask is not None and self.written.stale(key, "scratch_rows", rows):
            to_device_into(plan.scratch_rows, rows)

    def _fill_padded(self, g, batch: ForwardBatch, key) -> torch.Tensor:
        """Inputs of a step of fewer sequences or shorter queries than the block: each real
        token scattered to its row; returns those rows [T] int64 on the device."""
        s, plan, qlens = g.batch, g.batch.extra["gdn_plan"], batch.query_lens_cpu
        (Bg, Q), B, dev = key, len(qlens), s.input_ids.device
        # host lists -> one copy: each real token's row in the block, each sequence's last
        # token and scratch row
        where = [b * Q + i for b, q in enumerate(qlens) for i in range(q)]
        last = [q - 1 for q in qlens] + [Q - 1] * (Bg - B)
        host = to_device(where + last + self._scratch_rows(batch, Bg), torch.int64, dev)
        where_t, T = host[:len(where)], len(where)
        for buf, src, fill in ((s.input_ids, batch.input_ids, 0),
                               (s.positions, batch.positions, 0),
                               (s.slot_mapping, batch.slot_mapping, self.runner.pad_slot),
                               (s.attn.kv_len, batch.attn.kv_len, 1)):
            buf.fill_(fill)
            buf.index_copy_(0, where_t, src.to(buf.dtype))
        plan.last.copy_(host[T:T + Bg])
        self.written.forget(key, "layout", "scratch_rows")
        if plan.token_mask is not None:
            plan.scratch_rows.copy_(host[T + Bg:])
            plan.token_mask.zero_()
            plan.token_mask.index_fill_(0, where_t, 1.0)
        return where_t
