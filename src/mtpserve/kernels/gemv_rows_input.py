"""The input of a tiled product of a few rows, computed in front of it inside its programs.

A verify step of 1 + k tokens (or a decode step of a few requests) runs each decoder layer as
products of 2-16 rows (kernels/gemv_triton.py's pipelined tiles), with a residual add + RMSNorm
before the q/k/v and gate/up products and SiLU-and-mul before the down product: three small
kernels a layer, each a kernel boundary in a chain where every product waits for the kernel
before it. The one-row products take these inputs in their own programs (the streamed product,
kernels/gemv_stream_triton.py); here is the same for the tiles: each step of a program's loop
over the reduction loads its chunk of the input rows and computes the product's input from it.

- ``INPUT == 1``, SiLU-and-mul: ``x`` [M, 2K] = [gate | up] (checkpoint order); the chunk is
  ``silu(g) * u`` rounded to x's dtype, the bits ``fused_triton.silu_and_mul`` stores.
- ``INPUT == 2``, residual add + RMSNorm (pre-norm decoder; not zero-centred): ``s = r + x``
  rounded to the model dtype (x may be a split product's float32 partials, summed in their
  order first, as ``fused_triton.add_rms_norm`` sums them), stored as the new residual by the
  programs of the first output tile; the chunk fed to the product is ``s * w`` rounded to the
  model dtype, and the program adds up ``s^2`` per row. The norm's scale
  ``1 / sqrt(mean(s^2) + eps)`` is one number a row, so it multiplies the program's float32
  outputs at the end (``rms_scale``) instead of every input: one pass over the input, no
  second loop over K for the sum of squares. The result differs from ``add_rms_norm`` then the
  product by where the inputs are rounded (after ``s * w`` rather than after ``s * scale * w``):
  close, not bit-equal (tests/gemv_check.py bounds it); the new residual is bit-equal.

RMSNorm: Zhang & Sennrich, "Root Mean Square Layer Normalization" (2019), eq. 4.
"""

from __future__ import annotations

import triton
import triton.language as tl

PLAIN, SILU, NORM = 0, 1, 2


@triton.jit
def x_tile(x_ptr, r_ptr, nw_ptr, ro_ptr, sx, s_part, m, mmask, k, kmask, K, store_rows,
           INPUT: tl.constexpr, PARTS: tl.constexpr):
    """The product's input rows ``m`` at inputs ``k``: ([ROWS, BLOCK_K] in the model dtype,
    [ROWS] float32 sums of ``s^2`` over these inputs for NORM, else zeros). ``sx``: x's row
    stride (NORM: K, the residuals' too); ``s_part``: the partials' stride (PARTS > 0);
    ``store_rows``: how many rows' new residual this program writes (NORM: M or 0). Module doc."""
    mask = mmask[:, None] & kmask[None, :]
    off = m[:, None] * sx + k[None, :]
    zeros = tl.zeros([m.shape[0]], tl.float32)
    if INPUT == 1:
        g = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + off + K, mask=mask, other=0.0).to(tl.float32)
        return (g / (1.0 + tl.exp(-g)) * u).to(x_ptr.dtype.element_ty), zeros
    elif INPUT == 2:
        dt = ro_ptr.dtype.element_ty
        if PARTS > 0:
            x = tl.zeros(mask.shape, tl.float32)
            for p in tl.static_range(PARTS):
                x += tl.load(x_ptr + p * s_part + off, mask=mask, other=0.0)
            x = x.to(dt).to(tl.float32)
        else:
            x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        s = (tl.load(r_ptr + off, mask=mask, other=0.0).to(tl.float32) + x).to(dt)
        tl.store(ro_ptr + off, s, mask=(m < store_rows)[:, None] & kmask[None, :])
        s = s.to(tl.float32)
        nw = tl.load(nw_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        return (s * nw[None, :]).to(dt), tl.sum(s * s, axis=1)
    else:
        return tl.load(x_ptr + off, mask=mask, other=0.0), zeros


@triton.jit
def rms_scale(acc, ss, K, eps, INPUT: tl.constexpr):
    """``acc`` [ROWS, BLOCK_N] float32 times each row's RMSNorm scale from its sum of squares
    ``ss`` [ROWS] over the K inputs (NORM); ``acc`` itself otherwise."""
    if INPUT == 2:
        return acc * tl.rsqrt(ss / K + eps)[:, None]
    else:
        return acc
