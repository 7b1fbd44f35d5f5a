"""Paged attention for decode and speculative verify on CUDA, in Triton (split-K).

Each query token t attends to the first ``kv_len[t]`` positions of its sequence, whose K/V live in
the blocks listed in row ``table_row[t]`` of the block table: causal attention for any mix of
decode tokens, verify tokens (k + 1 per sequence) and prefill tokens, with shapes that depend
only on the number of tokens, so CUDA graphs can capture it. One program per (token, KV head,
context partition) runs an online softmax (Milakov & Gimelshein 2018) over its partition for all
query heads sharing that KV head (GQA); a second kernel merges the partitions (the split-K of
flash-decoding, Dao et al. 2023), or, with MERGE_IN_KERNEL, the last partition of a (token, KV
head) to finish does (kernels/arrival.py). Each token's context is spread evenly over the
partitions, so a short context runs its tiles in parallel too; partitions past the context
store nothing, and a context that fits one partition is written out without a merge. The
plain-PyTorch reference is ``paged_attention.py``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import arrival, pdl
from mtpserve.kernels.arrival import arrive_last
from mtpserve.kernels.pdl import pdl_wait

# on: the last partition to finish merges (kernels/arrival.py); off: a second kernel does.
# Off: with PDL the merge kernel's launch is hidden, and the in-kernel merge's atomics and
# fences cost more (H200, batch 1: 0.07-0.23 ms per step; BENCHMARKS.md)
MERGE_IN_KERNEL = False
# context tokens whose keys and values one loop iteration loads together (half past head_dim 128)
TILE = 64


@triton.jit
def _partial_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, row_ptr, len_ptr, m_ptr, l_ptr, acc_ptr,
                    o_ptr, count_ptr, scale, sq_t, sq_h, sk_s, sk_h, s_tab, so_t, so_h,
                    num_parts, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
                    D_PAD: tl.constexpr, P_PAD: tl.constexpr, BLOCK: tl.constexpr,
                    PART: tl.constexpr, TILE: tl.constexpr, MERGE: tl.constexpr,
                    PRECISION: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)   # scratch rows: T * Hq * parts * D_PAD may pass 2^31
    h = tl.program_id(1)
    p = tl.program_id(2)
    n = tl.load(len_ptr + t)
    row = tl.load(row_ptr + t).to(tl.int64)
    # the context is spread evenly over the partitions, whole tiles each: a short context keeps
    # its few tiles apart in parallel programs, a long one uses every partition
    span, live = _spread(n, num_parts, TILE)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    gmask = g < G
    dmask = d < D
    q = tl.load(q_ptr + t * sq_t + (h * G + g)[:, None] * sq_h + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0).to(k_ptr.dtype.element_ty)
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    first = p * span
    end = tl.minimum(n, first + span)
    for i in range(0, PART, TILE):  # static trip count (CUDA graphs; Triton interpreter)
        if first + i < end:  # tiles (and whole partitions) past the context are skipped
            pos = first + i + tl.arange(0, TILE)
            valid = pos < end
            # every key's block id and slot at once: the loads of a tile do not wait on each other
            blk = tl.load(tables_ptr + row * s_tab + pos // BLOCK, mask=valid, other=0)
            slot = blk.to(tl.int64) * BLOCK + pos % BLOCK
            kv_mask = valid[:, None] & dmask[None, :]
            kv_off = slot[:, None] * sk_s + h * sk_h + d[None, :]
            # the cache's own dtype into the dots (float32 accumulation): keeps a tile's keys and
            # values in registers at head_dim 256
            k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)
            v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale       # [G_PAD, TILE]
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))   # finite: the tile has a valid key
            alpha = tl.exp(m - m_new)
            pr = tl.exp(s - m_new[:, None])
            acc = acc * alpha[:, None] + tl.dot(pr.to(v.dtype), v, input_precision=PRECISION)
            l = l * alpha + tl.sum(pr, axis=1)
            m = m_new
    heads = t * tl.num_programs(1) * G + h * G + g             # [G_PAD] flat query heads
    if live == 1:   # one partition holds the whole context: no merge needed
        if p == 0:
            o = acc / l[:, None]
            tl.store(o_ptr + t * so_t + (h * G + g)[:, None] * so_h + d[None, :],
                     o.to(o_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])
    elif p < live:   # partitions past the context store nothing: the merge reads live ones
        out = heads * num_parts + p                            # [G_PAD] rows of m / l / acc
        tl.store(m_ptr + out, m, mask=gmask)
        tl.store(l_ptr + out, l, mask=gmask)
        tl.store(acc_ptr + out[:, None] * D_PAD + d[None, :], acc, mask=gmask[:, None])
        if MERGE:   # the last live partition of this (token, KV head) merges them all
            if arrive_last(count_ptr + t * tl.num_programs(1) + h, live):
                for j in tl.static_range(G):
                    _merge_head(m_ptr, l_ptr, acc_ptr, o_ptr + t * so_t + (h * G + j) * so_h,
                                (t * tl.num_programs(1) * G + h * G + j) * num_parts, live,
                                P_PAD, D, D_PAD)


@triton.jit
def _merge_head(m_ptr, l_ptr, acc_ptr, o_ptr, base, parts, P_PAD: tl.constexpr, D: tl.constexpr,
                D_PAD: tl.constexpr):
    """Merge the first ``parts`` partial softmaxes at rows ``base ..`` into one head's output
    (read from L2: the partials may come from other programs of the same kernel)."""
    p = tl.arange(0, P_PAD)
    d = tl.arange(0, D_PAD)
    pmask = p < parts
    m = tl.load(m_ptr + base + p, mask=pmask, other=float("-inf"), cache_modifier=".cg")
    l = tl.load(l_ptr + base + p, mask=pmask, other=0.0, cache_modifier=".cg")
    m_max = tl.max(m, axis=0)
    w = tl.where(l > 0, tl.exp(m - m_max), 0.0)
    acc = tl.load(acc_ptr + (base + p)[:, None] * D_PAD + d[None, :], mask=pmask[:, None],
                  other=0.0, cache_modifier=".cg")
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(o_ptr + d, o.to(o_ptr.dtype.element_ty), mask=d < D)


@triton.jit
def _merge_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, len_ptr, so_t, so_h, num_parts,
                  P_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                  TILE: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1)
    _, live = _spread(tl.load(len_ptr + t), num_parts, TILE)
    if live > 1:   # else the partition kernel wrote the output itself
        _merge_head(m_ptr, l_ptr, acc_ptr, o_ptr + t * so_t + hq * so_h,
                    (t * tl.num_programs(1) + hq) * num_parts, live, P_PAD, D, D_PAD)


@triton.jit
def _spread(n, num_parts, TILE: tl.constexpr):
    """(span, live): a context of ``n`` keys spread evenly over ``num_parts`` partitions of
    whole tiles: ``span`` keys each, the first ``live`` of them non-empty."""
    span = tl.cdiv(tl.cdiv(n, num_parts), TILE) * TILE
    return span, tl.cdiv(n, span)


def paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, table_row: torch.Tensor,
                           kv_len: torch.Tensor, scale: float, block_size: int,
                           part_size: int) -> torch.Tensor:
    """Attention of ``q`` [T, Hq, D] over paged K/V caches [slots, Hkv, D].

    Args:
        block_tables: [R, max_blocks] int32; table_row: [T] int32/64, each token's row;
        kv_len: [T] int32/64, keys each token attends to (its position + 1), >= 1;
        part_size: the longest partition, in context tokens (``partition_size``); the grid
            has ``ceil(max_blocks * block_size / part_size)`` partitions per (token, KV head).

    Returns:
        [T, Hq, D] in q's dtype.
    """
    T, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    G = Hq // Hkv
    max_blocks = block_tables.shape[1]
    num_parts = -(-max_blocks * block_size // part_size)
    d_pad = max(16, triton.next_power_of_2(D))
    p_pad = triton.next_power_of_2(num_parts)
    tile = min(TILE if D <= 128 else TILE // 2, triton.next_power_of_2(part_size))
    m = torch.empty(T, Hq, num_parts, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty(T, Hq, num_parts, d_pad, device=q.device, dtype=torch.float32)
    out = torch.empty(T, Hq, D, device=q.device, dtype=q.dtype)
    # the last partition to finish merges, unless there are more (token, KV head) pairs than
    # counters: then a second kernel does
    merge = MERGE_IN_KERNEL and T * Hkv <= arrival.NUM_COUNTERS
    # tl.dot needs 16 rows: the G query heads of a KV head are padded up to 16
    _partial_kernel[(T, Hkv, num_parts)](
        q, k_cache, v_cache, block_tables, table_row, kv_len, m, l, acc, out,
        arrival.counters(q.device), scale, q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), block_tables.stride(0), out.stride(0), out.stride(1), num_parts,
        G=G, G_PAD=max(16, triton.next_power_of_2(G)), D=D, D_PAD=d_pad, P_PAD=p_pad,
        BLOCK=block_size, PART=-(-part_size // tile) * tile, TILE=tile, MERGE=merge,
        PRECISION="ieee" if k_cache.dtype == torch.float32 else None, **pdl.launch(q))
    if not merge:
        _merge_kernel[(T, Hq)](m, l, acc, out, kv_len, out.stride(0), out.stride(1), num_parts,
                               P_PAD=p_pad, D=D, D_PAD=d_pad, TILE=tile, **pdl.launch(q))
    return out
