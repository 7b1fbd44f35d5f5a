"""Paged attention, plain-PyTorch reference (the CPU path and the test oracle for GPU kernels).

Causal softmax attention (Vaswani et al. 2017) of each sequence's new query tokens over its whole
context, whose K/V live in fixed-size blocks of a shared cache (PagedAttention, Kwon et al. 2023).
Sequences with few query tokens (decode, speculative verify) are padded into one batched call;
each longer one (prefill chunk) gets a call of its own, so padding never multiplies a prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mtpserve.engine.forward_batch import to_device

# SDPA backends on CUDA: not cuDNN, which builds an execution plan for each new shape (query
# and context lengths): the MTP's catch-up forward of a new length stalled 40-100 ms on the H200
# (benchmarks/gpu_mtp_catchup.py --profile-slow: all of it in scaled_dot_product_attention, a
# few ms the second time). The memory-efficient kernel takes the float mask; it gets K/V with
# their heads repeated for GQA, which it may not take as ``enable_gqa``.
CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

# Sequences with at most this many query tokens share one padded attention call.
SMALL_QUERY = 16
# Split-K partitions of the Triton kernel: at least this many context tokens each, and at most
# this many partitions (they size its scratch buffers).
MIN_PARTITION = 64
MAX_PARTITIONS = 32


def partition_size(max_model_len: int, block_size: int) -> int:
    """Context tokens per split-K partition of ``paged_attention_triton`` (a multiple of
    ``block_size``)."""
    size = max(MIN_PARTITION, -(-max_model_len // MAX_PARTITIONS))
    return -(-size // block_size) * block_size


@dataclass
class PaddedGroup:
    """Sequences attended in one ``scaled_dot_product_attention`` call.

    ``token_index`` [Tg] int64: flat token rows of this group (None: all tokens, in order);
    ``pad_index`` [Tg] int64: row ``b * max_q + i`` of each token in the padded query block
    (None when no padding is needed: every sequence has ``max_q`` query tokens);
    ``kv_index`` [Bg, max_ctx] int64: cache slot of each context position (padding reads slot 0);
    ``mask`` [Bg, 1, max_q, max_ctx] additive float mask: 0 where a query may attend a key, -inf
    elsewhere (built once per step in the attention dtype); None for a single decoding sequence,
    which attends to all of its context.
    """

    token_index: torch.Tensor | None
    pad_index: torch.Tensor | None
    batch: int
    max_q: int
    kv_index: torch.Tensor
    mask: torch.Tensor | None


@dataclass
class TorchAttentionMetadata:
    groups: list[PaddedGroup]


@dataclass
class TritonAttentionMetadata:
    """Per-token layout for ``paged_attention_triton`` (CUDA decode / verify; graph-capturable).

    ``table_row`` [T] int32: the block-table row of each token's sequence; ``kv_len`` [T] int32:
    keys each token attends to (its position + 1); ``block_tables`` [R, max_blocks] int32;
    ``part_size``: context tokens per split-K partition. ``rows_io`` [2T] int32 or None:
    ``table_row`` then ``kv_len`` back to back (both views of it), so a CUDA graph takes them
    in one copy (engine/cuda_graph.py).
    """

    table_row: torch.Tensor
    kv_len: torch.Tensor
    block_tables: torch.Tensor
    block_size: int
    part_size: int
    rows_io: torch.Tensor | None = None


def build_torch_metadata(query_lens: list[int], seq_lens: list[int], block_tables: torch.Tensor,
                         block_size: int, device: torch.device,
                         dtype: torch.dtype = torch.float32) -> TorchAttentionMetadata:
    """Group the batch for :func:`paged_attention_ref`.

    Args:
        query_lens: new tokens per sequence (host ints); seq_lens: context length after them.
        block_tables: [B, max_blocks] int32 on ``device``; dtype: the attention dtype.
    """
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    small = [b for b, q in enumerate(query_lens) if q <= SMALL_QUERY]
    groups = []
    if small:
        groups.append(_group(small, starts, query_lens, seq_lens, block_tables, block_size, device,
                             dtype, all_tokens=len(small) == len(query_lens)))
    for b, q in enumerate(query_lens):
        if q > SMALL_QUERY:
            groups.append(_group([b], starts, query_lens, seq_lens, block_tables, block_size,
                                 device, dtype, all_tokens=len(query_lens) == 1))
    return TorchAttentionMetadata(groups)


def _group(seqs, starts, query_lens, seq_lens, block_tables, block_size, device, dtype,
           all_tokens):
    """One :class:`PaddedGroup` of the sequences ``seqs``. Its host lists reach the device
    through pinned memory without a sync (``to_device``): under async scheduling a CUDA tensor
    built straight from a list waited for the steps queued before it (H200, session 13: four
    such waits per long run in every MTP catch-up with a prefill chunk)."""
    qlens = [query_lens[b] for b in seqs]
    ctx = to_device([seq_lens[b] for b in seqs], torch.int64, device)
    max_q, max_ctx = max(qlens), max(seq_lens[b] for b in seqs)
    token_index = None if all_tokens else to_device(
        [starts[b] + i for b in seqs for i in range(query_lens[b])], torch.int64, device)
    pad_index = None if all(q == max_q for q in qlens) else to_device(
        [g * max_q + i for g, q in enumerate(qlens) for i in range(q)], torch.int64, device)
    pos = torch.arange(max_ctx, device=device)
    tables = block_tables.index_select(0, to_device(seqs, torch.int64, device)).long()
    kv_index = tables[:, pos // block_size] * block_size + pos % block_size
    qlen_t = to_device(qlens, torch.int64, device)
    i = torch.arange(max_q, device=device)
    qpos = (ctx - qlen_t).unsqueeze(1) + i.unsqueeze(0)          # [Bg, max_q]
    qpos = torch.where(i.unsqueeze(0) < qlen_t.unsqueeze(1), qpos, 0)  # padding rows see key 0
    if len(seqs) == 1 and max_q == 1:
        mask = None  # one decoding sequence attends to its whole context
    else:
        allowed = (pos.view(1, 1, -1) <= qpos.unsqueeze(-1)).unsqueeze(1)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
        mask.masked_fill_(~allowed, -torch.inf)
    return PaddedGroup(token_index, pad_index, len(seqs), max_q, kv_index, mask)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store this step's keys/values: ``k``, ``v`` [T, Hkv, D] into caches [slots, Hkv, D]."""
    k_cache.index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: TorchAttentionMetadata, scale: float) -> torch.Tensor:
    """Attention of ``q`` [T, Hq, D] over cached K/V ([slots, Hkv, D], GQA when Hq > Hkv).

    Returns [T, Hq, D] in q's dtype. The current step's K/V must already be written.
    """
    T, Hq, D = q.shape
    out = q.new_empty(T, Hq, D) if len(meta.groups) > 1 else None
    for g in meta.groups:
        qg = q if g.token_index is None else q[g.token_index]
        if g.pad_index is not None:
            qp = qg.new_zeros(g.batch * g.max_q, Hq, D)
            qp[g.pad_index] = qg
            qg = qp
        qp = qg.view(g.batch, g.max_q, Hq, D).transpose(1, 2)
        k = k_cache[g.kv_index].transpose(1, 2).to(q.dtype)
        v = v_cache[g.kv_index].transpose(1, 2).to(q.dtype)
        o = _sdpa(qp, k, v, g.mask, scale)
        o = o.transpose(1, 2).reshape(g.batch * g.max_q, Hq, D)
        if g.pad_index is not None:
            o = o[g.pad_index]
        if out is None:
            return o
        out[g.token_index] = o
    return out


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
          scale: float) -> torch.Tensor:
    """``scaled_dot_product_attention`` of q [B, Hq, Q, D] over k, v [B, Hkv, C, D] (GQA when
    Hq > Hkv); on CUDA through ``CUDA_SDPA_BACKENDS`` only."""
    gqa = q.shape[1] != k.shape[1]
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=gqa)
    if gqa:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    with sdpa_kernel(CUDA_SDPA_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def per_token_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            meta: TritonAttentionMetadata, scale: float) -> torch.Tensor:
    """Plain-PyTorch attention over the per-token layout of ``paged_attention_triton``: token t
    attends to keys 0..kv_len[t]-1 of block-table row table_row[t]. ``q`` [T, Hq, D], caches
    [slots, Hkv, D] -> [T, Hq, D] in q's dtype, float32 softmax. The reference (CPU) for the
    layout CUDA graphs use; one host sync for the longest context."""
    T, Hq, D = q.shape
    hkv = k_cache.shape[1]
    pos = torch.arange(int(meta.kv_len.max()), device=q.device)
    tables = meta.block_tables[meta.table_row.long()].long()               # [T, max_blocks]
    slots = tables[:, pos // meta.block_size] * meta.block_size + pos % meta.block_size
    k = k_cache[slots].float().repeat_interleave(Hq // hkv, dim=2)       # [T, L, Hq, D]
    v = v_cache[slots].float().repeat_interleave(Hq // hkv, dim=2)
    scores = torch.einsum("thd,tlhd->thl", q.float(), k) * scale
    scores.masked_fill_((pos[None, :] >= meta.kv_len[:, None].long())[:, None, :], -torch.inf)
    return torch.einsum("thl,tlhd->thd", scores.softmax(-1), v).to(q.dtype)
