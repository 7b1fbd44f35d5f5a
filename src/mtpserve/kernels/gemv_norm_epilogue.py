"""The residual add + RMSNorm after a product of a few rows, done by the product's own programs.

In a verify forward (1 + k tokens) each decoder layer's o and down products of a few rows are
followed by a residual add + RMSNorm kernel (``fused_triton.add_rms_norm``: a handful of
programs, one a row), and the next product waits for it: on the H200 each such kernel adds
2.4-3.1 us to a 1.7B layer of 4 tokens (BENCHMARKS.md, session 26). Here the product finishes
the norm itself:

1. each output tile, once its values are final (unsplit, or summed by the last of its split-K
   programs, kernels/arrival.py), adds the residual: ``s = r + y`` rounded to the model dtype
   as the product's output and the add are rounded in the unfused path, and stores ``s`` (the
   new residual);
2. the last tile to arrive (a second arrival, over the tiles) loads the whole rows of ``s`` at
   once (``ROWS_OUT`` rows of ``N_PAD`` columns, so at most ``MAX_ROWS`` rows: one wave of
   loads, one of stores, no chain of dependent loads), takes ``1 / sqrt(mean(s^2) + eps)`` and
   writes the normed rows ``s * scale * w`` (``fused_triton``'s arithmetic).

The new residual is bit-equal to ``add_rms_norm``'s; the normed rows may differ from its in the
last bit where the sum of squares, added in another order, rounds otherwise.
RMSNorm: Zhang & Sennrich, "Root Mean Square Layer Normalization" (2019), eq. 4.
"""

from __future__ import annotations

import triton
import triton.language as tl

from mtpserve.kernels.arrival import arrive_last

# most rows whose norm the last tile takes (its registers hold them whole: [4, 2048] float32 is
# 64 registers a thread at 4 warps)
MAX_ROWS = 4


@triton.jit
def norm_epilogue(acc, m, mmask, n, nmask, M, N, r_ptr, nw_ptr, h_ptr, ro_ptr, count_ptr, eps,
                  ROWS_OUT: tl.constexpr, N_PAD: tl.constexpr):
    """``acc`` [ROWS, BLOCK_N] float32: this tile's final products (rows ``m``, columns ``n``
    of y [M, N]). ``r``, ``ro``, ``h`` [M, N] contiguous: residual in, new residual and normed
    rows out; ``nw`` [N] the norm weight; ``count_ptr + tiles`` the tiles' arrival counter
    (``tiles`` = the grid's first dimension). ``ROWS_OUT`` >= M and ``N_PAD`` >= N, powers of
    two. Module doc."""
    dt = ro_ptr.dtype.element_ty
    off = m[:, None] * N + n[None, :]
    mask = mmask[:, None] & nmask[None, :]
    y = acc.to(dt).to(tl.float32)
    s = (tl.load(r_ptr + off, mask=mask, other=0.0).to(tl.float32) + y).to(dt)
    tl.store(ro_ptr + off, s, mask=mask)
    tiles = tl.num_programs(0)
    if arrive_last(count_ptr + tiles, tiles):
        rows = tl.arange(0, ROWS_OUT)
        cols = tl.arange(0, N_PAD)
        rmask = (rows < M)[:, None] & (cols < N)[None, :]
        roff = rows[:, None] * N + cols[None, :]
        sf = tl.load(ro_ptr + roff, mask=rmask, other=0.0, cache_modifier=".cg").to(tl.float32)
        w = tl.load(nw_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        scale = tl.rsqrt(tl.sum(sf * sf, axis=1) / N + eps)
        tl.store(h_ptr + roff, (sf * scale[:, None] * w[None, :]).to(dt), mask=rmask)
