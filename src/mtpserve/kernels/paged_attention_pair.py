"""Paged attention for many tokens: one program per (token, KV head) over the token's whole
context (kernels/paged_attention_triton.py launches it once there are at least
``PAIR_KERNEL_PAIRS_PER_SM`` such pairs per SM).

The program runs one loop over the context's tiles. The online softmax restarts at each
partition's first tile (the partitions of ``spread``, the same as when partitions run in
parallel programs), and where the loop passes a partition's end the partition is folded into
the output (``fold``), in the order the merge kernel folds them. So a token gets the same bits
as in a smaller batch (at the same block-table width, which sets the partitions), while one
loop lets Triton's software pipelining keep the next tiles' loads in flight (``STAGES``) and
no partial result goes through memory. On the H200 (session 25, benchmarks/gpu_attention.py)
this took Qwen3-8B's attention at 64 tokens of 160-key contexts from 41.5 to 20.4 us (1024
keys: 155 -> 88 us; 4096: 510 -> 338 us) against running the partitions one after another,
storing them and merging after the max over all of them; a Qwen3-8B batch-64 decode went from
9.7k to 11.3k tokens/s (BENCHMARKS.md, session 25)."""

from __future__ import annotations

import triton
import triton.language as tl

from mtpserve.kernels.jit_options import unspecialized
from mtpserve.kernels.paged_attention_tiles import (empty_softmax, fold, load_q, spread, tile_kv,
                                                    tile_step)
from mtpserve.kernels.pdl import pdl_wait


@triton.jit(**unspecialized(ints=("s_tab", "num_parts"),
                            pointers=("tables_ptr", "row_ptr", "len_ptr")))
def pair_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, row_ptr, len_ptr, o_ptr, scale, sq_t, sq_h,
                sk_s, sk_h, s_tab, so_t, so_h, num_parts,
                G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                BLOCK: tl.constexpr, TILE: tl.constexpr, PRECISION: tl.constexpr,
                STAGES: tl.constexpr, PDL: tl.constexpr):
    """Grid (T, Hkv): the attention of token t's G query heads of KV head h over its
    ``len_ptr[t]`` keys (the block-table row ``row_ptr[t]``), written to ``o_ptr``."""
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    n = tl.load(len_ptr + t)
    table = tables_ptr + tl.load(row_ptr + t).to(tl.int64) * s_tab
    span, _ = spread(n, num_parts, TILE)
    per = span // TILE   # tiles per partition
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    gmask = g < G
    dmask = d < D
    q = load_q(q_ptr, t, h, sq_t, sq_h, g, d, gmask, dmask, G, k_ptr.dtype.element_ty)
    m, l, acc = empty_softmax(G_PAD, D_PAD)     # the partition running
    mo, lo, ao = empty_softmax(G_PAD, D_PAD)    # the partitions folded so far
    tiles = tl.cdiv(n, TILE)
    for j in tl.range(0, tiles, num_stages=STAGES):
        pos = j * TILE + tl.arange(0, TILE)
        valid = pos < n   # a tile lies within its partition's span: its end is n or beyond
        k, v = tile_kv(k_ptr, v_ptr, table, pos, valid, sk_s, h * sk_h, d, dmask, BLOCK)
        m, l, acc = tile_step(q, k, v, valid, m, l, acc, scale, PRECISION)
        if ((j + 1) % per == 0) | (j + 1 == tiles):   # partition j // per ends here
            mo, a, b = fold(mo, m)
            lo = lo * a + l * b
            ao = ao * a[:, None] + acc * b[:, None]
            m, l, acc = empty_softmax(G_PAD, D_PAD)
    tl.store(o_ptr + t * so_t + (h * G + g)[:, None] * so_h + d[None, :],
             (ao / lo[:, None]).to(o_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])
