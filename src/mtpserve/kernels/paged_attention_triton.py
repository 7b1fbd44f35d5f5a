"""Paged attention for decode and speculative verify on CUDA, in Triton (split-K).

Each query token t attends to the first ``kv_len[t]`` positions of its sequence, whose K/V live in
the blocks listed in row ``table_row[t]`` of the block table: causal attention for any mix of
decode tokens, verify tokens (k + 1 per sequence) and prefill tokens, with shapes that depend
only on the number of tokens, so CUDA graphs can capture it. A token's context is cut into
partitions (the split-K of flash-decoding, Dao et al. 2023), spread evenly, whole tiles each, so
a short context runs its tiles in parallel too; each partition runs an online softmax (Milakov &
Gimelshein 2018) for all query heads sharing its KV head (GQA), and the partitions are merged
one after another in a fixed order (an online merge, kernels/paged_attention_tiles.py
``fold``). The partitions depend only on the context length and the table width, never on the
batch, so a token gets the same bits in any batch. How they are run does depend on the batch:
few tokens get one program per (token, KV head, partition) and a second kernel merges; many
tokens (at least ``PAIR_KERNEL_PAIRS_PER_SM`` (token, KV head) pairs per SM) get one program
per (token, KV head) that runs its context as one loop over tiles and folds each partition in
as it ends (kernels/paged_attention_pair.py), so no program is launched for a partition past the
context and no merge kernel runs. (The last of a pair's parallel programs merging them,
counted by kernels/arrival.py, in place of the merge kernel was slower on the H200, one query
head after another or all at once, and the latter compiled in seconds: BENCHMARKS.md, session
20.) The partial kernel doing a one-token step's q/k norms, RoPE and K/V write itself (one
kernel fewer a layer) was measured and removed: no faster on the H200, a batch-1 Qwen3-1.7B
step 1.302 ms with it against 1.303-1.304 without, an 8B one 4.033 against 3.988-3.990 (1.1%
slower); BENCHMARKS.md, session 24 (commit 0d82b6d holds the code).

Loads before the PDL wait (``EARLY_KV``): under PDL (kernels/pdl.py) a kernel may start while
the one before it runs, but every kernel before that one has finished, since that one let it
launch only after its own wait (or, a PyTorch kernel before it, launched in plain stream order
after all of them). The kernel before the attention writes q and this step's
K/V (or computes q); the lengths, block tables and older K/V come from earlier kernels or steps.
So where partitions run in parallel programs (few tokens), each program loads its
token's length and block-table row and its first tile's keys and values before the wait, and
after it q and, again, the keys and values of the tile's positions among the context's last T
(T: the tokens of the launch, at least the step's new tokens in any one sequence). The bits are
those without it. On the H200 it took a batch-1 step from 1.299 to 1.266 ms at Qwen3-1.7B and
from 4.032 to 3.989 ms at Qwen3-8B (BENCHMARKS.md, session 24). The plain-PyTorch reference is
``paged_attention.py``."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.jit_options import unspecialized
from mtpserve.kernels.paged_attention_pair import pair_kernel
from mtpserve.kernels.paged_attention_tiles import (empty_softmax, fold, load_q, spread, tile_kv,
                                                    tile_step)
from mtpserve.kernels.pdl import pdl_wait

MIN_P_PAD = 16   # partitions a merge is compiled for, at least

# one program per (token, KV head) running all its partitions (kernels/paged_attention_pair.py)
# once there are this many pairs per SM; below, the partitions of a pair run in parallel programs
# (up to PROGRAMS_PER_SM per SM) and a second kernel merges them. On the H200 (132 SMs, session
# 25 run 5, benchmarks/gpu_attention.py --variants base pairs) the pair kernel was faster from
# 128 pairs but at long contexts (16 tokens of 8 KV heads: 8.8 against 14.1 us at 160 keys, 35
# against 40 at 1024, slower at 4096: 127 against 122; 32 tokens faster at every length) and
# far slower at 32 pairs (4 tokens: 118 against 35 us at 4096 keys); 0.9 against 2 took a
# batch-16 decode from 3457 to 3595 tok/s at Qwen3-8B and from 8909 to 9984 at Qwen3-1.7B
# (run 6, gpu_decode --set)
PAIR_KERNEL_PAIRS_PER_SM = 0.9
PROGRAMS_PER_SM = 4
# context tokens whose keys and values one loop iteration loads together (half past head_dim 128)
TILE = 64
# on: partitions run in parallel programs load their first tile of keys and values before the
# PDL wait (module doc). On the H200 a batch-1 step: Qwen3-1.7B 1.299 -> 1.266 ms, Qwen3-8B
# 4.032 -> 3.989 (BENCHMARKS.md, session 24, run 3). At the kernel's 4 warps the tile held
# across the wait spills 280 bytes (sm_90 ptxas, head_dim 128); 8 warps spill none and were
# 0.3-0.4% faster still, but change the sum order and so the bits against the pair kernel's
# programs (many tokens, NUM_WARPS): a token would get other bits in a larger batch
EARLY_KV = True
# software-pipelined stages of the pair kernel's tile loop (kernels/paged_attention_pair.py);
# on the H200 2 and 3 were alike and 1 slower (session 25, benchmarks/gpu_attention.py)
PAIR_STAGES = 2
# warps of the partial and pair kernels: the two must match, as the row sums' order and so a
# token's bits depend on them (the merge kernel's do not). 8 were 0.3-0.4% faster at batch 1
# (session 24) and at 64 tokens of short contexts (session 25), but slower at 16 tokens and at
# one token of 1024 keys (session 25, benchmarks/gpu_attention.py)
NUM_WARPS = 4


# Sizes and views that change from step to step are not specialized on (kernels/jit_options.py):
# a block table's width ``s_tab``, the partition count, and the alignment of the block-table and
# length views made the MTP's first catch-ups at 64 requests compile at use (H200, 0.6-0.7 s
# each, benchmarks/gpu_mtp_load.py).
@triton.jit(**unspecialized(ints=("s_tab", "num_parts", "fresh"),
                            pointers=("tables_ptr", "row_ptr", "len_ptr")))
def _partial_kernel(q_ptr, k_ptr, v_ptr, ke_ptr, ve_ptr, tables_ptr, row_ptr, len_ptr, m_ptr,
                    l_ptr, acc_ptr, o_ptr, scale, sq_t, sq_h, sk_s, sk_h, s_tab, so_t, so_h,
                    num_parts, fresh,
                    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                    BLOCK: tl.constexpr, PART: tl.constexpr, TILE: tl.constexpr,
                    PRECISION: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    if not EARLY:
        pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)   # scratch rows: T * Hq * parts * D_PAD may pass 2^31
    h = tl.program_id(1)
    n = tl.load(len_ptr + t)
    row = tl.load(row_ptr + t).to(tl.int64)
    table = tables_ptr + row * s_tab
    # the context is spread evenly over the partitions, whole tiles each: a short context keeps
    # its few tiles apart in parallel programs, a long one uses every partition
    span, live = spread(n, num_parts, TILE)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    gmask = g < G
    dmask = d < D
    p0 = tl.program_id(2)
    if EARLY:   # this program's first tile before the wait (module doc), its fresh keys after
        pos = p0 * span + tl.arange(0, TILE)
        end = tl.minimum(n, p0 * span + span)
        k0, v0 = tile_kv(ke_ptr, ve_ptr, table, pos, pos < end, sk_s, h * sk_h, d, dmask, BLOCK)
        pdl_wait(PDL)
        new = (pos < end) & (pos >= n - fresh)
        k1, v1 = tile_kv(k_ptr, v_ptr, table, pos, new, sk_s, h * sk_h, d, dmask, BLOCK)
        k0 = tl.where(new[:, None], k1, k0)
        v0 = tl.where(new[:, None], v1, v0)
    else:   # EARLY off: k0 / v0 unused
        k0 = tl.zeros([TILE, D_PAD], k_ptr.dtype.element_ty)
        v0 = k0
    q = load_q(q_ptr, t, h, sq_t, sq_h, g, d, gmask, dmask, G, k_ptr.dtype.element_ty)
    heads = t * tl.num_programs(1) * G + h * G + g             # [G_PAD] flat query heads
    # program p of the grid's third axis takes partitions p, p + grid, ...: the same partitions
    # and the same bits for any grid (the grid only sets how many run side by side)
    for p in range(p0, live, tl.num_programs(2)):
        first = p * span
        m, l, acc = _partition(q, k_ptr, v_ptr, table, first, tl.minimum(n, first + span),
                               scale, sk_s, h * sk_h, d, dmask, k0, v0, p == p0, EARLY,
                               G_PAD, D_PAD, BLOCK, PART, TILE, PRECISION)
        if live == 1:   # one partition holds the whole context: no merge needed
            o = acc / l[:, None]
            tl.store(o_ptr + t * so_t + (h * G + g)[:, None] * so_h + d[None, :],
                     o.to(o_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])
        else:   # partitions past the context store nothing: the merge reads live ones
            out = heads * num_parts + p                        # [G_PAD] rows of m / l / acc
            tl.store(m_ptr + out, m, mask=gmask)
            tl.store(l_ptr + out, l, mask=gmask)
            tl.store(acc_ptr + out[:, None] * D_PAD + d[None, :], acc, mask=gmask[:, None])


@triton.jit
def _partition(q, k_ptr, v_ptr, table, first, end, scale, sk_s, head_off, d, dmask, k0, v0,
               at_k0, EARLY: tl.constexpr, G_PAD: tl.constexpr, D_PAD: tl.constexpr,
               BLOCK: tl.constexpr, PART: tl.constexpr, TILE: tl.constexpr,
               PRECISION: tl.constexpr):
    """Online softmax of ``q`` [G_PAD, D_PAD] over context positions ``first .. end``
    (``table``: the sequence's block-table row); returns the running max m [G_PAD],
    denominator l [G_PAD] and unnormalised output acc [G_PAD, D_PAD] (float32). With EARLY,
    where ``at_k0``, the first tile's keys and values are ``k0`` / ``v0`` [TILE, D_PAD],
    loaded already."""
    m, l, acc = empty_softmax(G_PAD, D_PAD)
    for i in range(0, PART, TILE):  # static trip count (CUDA graphs; Triton interpreter)
        if first + i < end:  # tiles past the context are skipped
            pos = first + i + tl.arange(0, TILE)
            valid = pos < end
            if EARLY:
                if at_k0 & (i == 0):
                    k, v = k0, v0
                else:
                    k, v = tile_kv(k_ptr, v_ptr, table, pos, valid, sk_s, head_off, d, dmask,
                                   BLOCK)
            else:
                k, v = tile_kv(k_ptr, v_ptr, table, pos, valid, sk_s, head_off, d, dmask, BLOCK)
            m, l, acc = tile_step(q, k, v, valid, m, l, acc, scale, PRECISION)
    return m, l, acc


@triton.jit(**unspecialized(ints=("num_parts",), pointers=("len_ptr",)))
def _merge_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, len_ptr, so_t, so_h, num_parts,
                  P_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                  TILE: tl.constexpr, PDL: tl.constexpr):
    """Grid (T, Hq): query head hq of token t, its first ``live`` partial softmaxes (rows
    ``(t * Hq + hq) * num_parts ..`` of m / l / acc, from L2 where the partial kernel stored
    them) folded in one after another, as the pair kernel folds them."""
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1)
    _, live = spread(tl.load(len_ptr + t), num_parts, TILE)
    if live > 1:   # else the partition kernel wrote the output itself
        base = (t * tl.num_programs(1) + hq) * num_parts
        d = tl.arange(0, D_PAD)
        mo = float("-inf")
        lo = 0.0
        ao = tl.zeros([D_PAD], tl.float32)
        for j in tl.static_range(P_PAD):   # masked, not branched: the loads can all be in flight
            on = j < live
            mj = tl.load(m_ptr + base + j, mask=on, other=float("-inf"), cache_modifier=".cg")
            lj = tl.load(l_ptr + base + j, mask=on, other=0.0, cache_modifier=".cg")
            # [D_PAD] mask: the interpreter takes no scalar mask for a vector load
            aj = tl.load(acc_ptr + (base + j) * D_PAD + d, mask=d * 0 + j < live, other=0.0,
                         cache_modifier=".cg")
            mo, a, b = fold(mo, mj)   # a partition past ``live``: a = 1, b = 0, no change
            lo = lo * a + lj * b
            ao = ao * a + aj * b
        tl.store(o_ptr + t * so_t + hq * so_h + d, (ao / lo).to(o_ptr.dtype.element_ty),
                 mask=d < D)


def paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, table_row: torch.Tensor,
                           kv_len: torch.Tensor, scale: float, block_size: int,
                           part_size: int, grid_parts: int | None = None,
                           early_kv: tuple[torch.Tensor, torch.Tensor] | None = None
                           ) -> torch.Tensor:
    """Attention of ``q`` [T, Hq, D] over paged K/V caches [slots, Hkv, D].

    Before its PDL wait (``EARLY_KV`` on, partitions in parallel programs) each program loads
    its token's length, block-table row and its first tile's keys and values; after it, the keys
    and values of that tile's positions among the context's last T again (module doc). So the
    kernel just before may write q and this step's own K/V, but not the lengths, the block tables
    or older K/V.

    Args:
        block_tables: [R, max_blocks] int32; table_row: [T] int32/64, each token's row;
        kv_len: [T] int32/64, keys each token attends to (its position + 1), >= 1;
        part_size: the longest partition, in context tokens (``partition_size``): a token has
            ``ceil(max_blocks * block_size / part_size)`` partitions;
        grid_parts: programs per (token, KV head) (tests; default ``_grid_parts``): 1 runs
            the pair kernel (all partitions in one program), more run partitions side by side
            and merge in a second kernel. The output's bits do not depend on it.
        early_kv: (tests) the K/V caches as a program may see them before its wait, by default
            ``k_cache`` and ``v_cache``; a copy whose last T positions of each context hold
            other values must give the same bits.

    Returns:
        [T, Hq, D] in q's dtype.
    """
    T, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    G = Hq // Hkv
    num_parts = -(-block_tables.shape[1] * block_size // part_size)
    grid_parts = min(num_parts, grid_parts or _grid_parts(q.device, T * Hkv))
    d_pad = max(16, triton.next_power_of_2(D))
    # at least 16: a merge over fewer partitions is the same masked loop, and each power of two
    # below it was one more variant to compile (an MTP catch-up's short tables, at use)
    p_pad = max(MIN_P_PAD, triton.next_power_of_2(num_parts))
    tile = min(TILE if D <= 128 else TILE // 2, triton.next_power_of_2(part_size))
    out = torch.empty(T, Hq, D, device=q.device, dtype=q.dtype)
    ke, ve = early_kv or (k_cache, v_cache)
    precision = "ieee" if k_cache.dtype == torch.float32 else None
    g_pad = max(16, triton.next_power_of_2(G))   # tl.dot needs 16 rows: G heads padded to 16
    if grid_parts == 1:
        pair_kernel[(T, Hkv)](
            q, k_cache, v_cache, block_tables, table_row, kv_len, out, scale, q.stride(0),
            q.stride(1), k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
            out.stride(0), out.stride(1), num_parts, G=G, G_PAD=g_pad, D=D, D_PAD=d_pad,
            BLOCK=block_size, TILE=tile, PRECISION=precision, STAGES=PAIR_STAGES,
            num_warps=NUM_WARPS, **pdl.launch(q))
        return out
    m = torch.empty(T, Hq, num_parts, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty(T, Hq, num_parts, d_pad, device=q.device, dtype=torch.float32)
    _partial_kernel[(T, Hkv, grid_parts)](
        q, k_cache, v_cache, ke, ve, block_tables, table_row, kv_len, m, l, acc, out, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1), num_parts, T, G=G, G_PAD=g_pad, D=D, D_PAD=d_pad,
        BLOCK=block_size, PART=-(-part_size // tile) * tile, TILE=tile, PRECISION=precision,
        EARLY=EARLY_KV, num_warps=NUM_WARPS, **pdl.launch(q))
    _merge_kernel[(T, Hq)](m, l, acc, out, kv_len, out.stride(0), out.stride(1), num_parts,
                           P_PAD=p_pad, D=D, D_PAD=d_pad, TILE=tile, **pdl.launch(q))
    return out


def _grid_parts(device: torch.device, pairs: int) -> int:
    """Programs per (token, KV head) for ``pairs`` such pairs: 1 (the pair kernel) once there
    are ``PAIR_KERNEL_PAIRS_PER_SM`` pairs per SM, else enough to fill ``PROGRAMS_PER_SM``
    programs per SM, at least 2 (also with the pair kernel switched off by a threshold past
    any batch, as benchmarks do)."""
    sms = _sm_count(device)
    if pairs >= PAIR_KERNEL_PAIRS_PER_SM * sms:
        return 1
    # no tokens: an empty grid anyway
    return max(2, -(-PROGRAMS_PER_SM * sms // max(pairs, 1)))


@functools.cache
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (the CPU interpreter: 4)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
