"""Tile-level pieces of the Triton paged attention (kernels/paged_attention_triton.py and
kernels/paged_attention_pair.py): a tile's keys and values gathered through the block table,
the queries of a KV head, one tile's step of the online softmax from its empty start, the
online merge of partitions, and the spread of a context over its partitions. Every kernel that
computes a partition or merges partitions uses these same functions, so a token's bits do not
depend on which kernel ran it."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_kv(k_ptr, v_ptr, table, pos, valid, sk_s, head_off, d, dmask, BLOCK: tl.constexpr):
    """Keys and values [TILE, D_PAD] (the cache's dtype) of context positions ``pos`` [TILE]
    where ``valid`` (zeros elsewhere): every key's block id and slot at once, so the loads of a
    tile do not wait on each other. ``table``: the sequence's block-table row (int32 block ids
    of ``BLOCK`` slots); ``sk_s`` / ``head_off``: the caches' slot stride and KV head offset,
    in elements."""
    blk = tl.load(table + pos // BLOCK, mask=valid, other=0)
    slot = blk.to(tl.int64) * BLOCK + pos % BLOCK
    kv_mask = valid[:, None] & dmask[None, :]
    kv_off = slot[:, None] * sk_s + head_off + d[None, :]
    return (tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0),
            tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0))


@triton.jit
def load_q(q_ptr, t, h, sq_t, sq_h, g, d, gmask, dmask, G: tl.constexpr, dtype):
    """Queries [G_PAD, D_PAD] of token ``t``'s G heads sharing KV head ``h`` (rows ``g`` past G
    and columns ``d`` past D zero), converted to ``dtype`` (the cache's) for the dots."""
    return tl.load(q_ptr + t * sq_t + (h * G + g)[:, None] * sq_h + d[None, :],
                   mask=gmask[:, None] & dmask[None, :], other=0.0).to(dtype)


@triton.jit
def empty_softmax(G_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """An online softmax before its first tile: max -inf [G_PAD], denominator 0 [G_PAD], output
    0 [G_PAD, D_PAD], float32."""
    return (tl.full([G_PAD], float("-inf"), tl.float32), tl.zeros([G_PAD], tl.float32),
            tl.zeros([G_PAD, D_PAD], tl.float32))


@triton.jit
def tile_step(q, k, v, valid, m, l, acc, scale, PRECISION: tl.constexpr):
    """One tile of the online softmax (Milakov & Gimelshein 2018): queries ``q`` [G_PAD,
    D_PAD] against keys / values ``k``, ``v`` [TILE, D_PAD] (the cache's dtype into the dots,
    float32 accumulation) where ``valid`` [TILE] (at least one); returns the running max m
    [G_PAD], denominator l [G_PAD] and unnormalised output acc [G_PAD, D_PAD], float32."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale       # [G_PAD, TILE]
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))   # finite: the tile has a valid key
    alpha = tl.exp(m - m_new)
    pr = tl.exp(s - m_new[:, None])
    acc = acc * alpha[:, None] + tl.dot(pr.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l * alpha + tl.sum(pr, axis=1), acc


@triton.jit
def fold(mo, m):
    """The online merge of a partition's (m, l, acc) into the partitions merged so far (mo, lo,
    ao) (the merge step of flash-decoding, Dao et al. 2023, one partition at a time): returns
    (max, a, b), and the caller takes ``lo * a + l * b`` and ``ao * a + acc * b`` (a, b
    broadcast over head_dim), the same operations for one head as for a block of heads. One
    exponential: the side whose max is the larger gets weight 1, the other exp(-|m - mo|). The
    first fold (mo = -inf, lo = ao = 0) gives (m, l, acc) exactly; once mo is finite, a masked
    partition (m = -inf) changes nothing. m and mo both -inf would give NaN: the first fold is
    always of a partition with a key."""
    up = m > mo
    e = tl.exp(-tl.abs(m - mo))
    return tl.maximum(mo, m), tl.where(up, e, 1.0), tl.where(up, 1.0, e)


@triton.jit
def spread(n, num_parts, TILE: tl.constexpr):
    """(span, live): a context of ``n`` keys spread evenly over ``num_parts`` partitions of
    whole tiles: ``span`` keys each, the first ``live`` of them non-empty."""
    span = tl.cdiv(tl.cdiv(n, num_parts), TILE) * TILE
    return span, tl.cdiv(n, span)
