"""An LM head in 8-bit floats for MTP drafts: half the bytes of the bf16 head per draft step.

A greedy MTP draft step ends in an LM head whose only use is its argmax (spec/draft_head.py):
on the hybrid Qwen3-Next shape the full head is 152k x 2048 bf16, 0.62 GB read per draft, ~204
us of a ~2.7 ms MTP step on an H100 for each of the k = 3 drafts (BENCHMARKS.md, session 35).
Drafting is lossless whatever the head computes (verification runs the target's own bf16 head),
so the draft head may be approximate: here its weight is stored once as OCP FP8 E4M3 (3
mantissa bits, largest finite value 448; Micikevicius et al. 2022, "FP8 Formats for Deep
Learning", arXiv 2209.05433) with one float32 scale per vocabulary row (the row's largest
magnitude / 448, as per-channel weight quantization does), and the product reads 1 byte a
weight instead of 2. The activations stay in their 16-bit dtype; products are float32.

:func:`fp8_logits` gives ``x [M, H] @ (scale[:, None] * w8)^T`` as float32 logits [M, N]. On
CUDA (or under ``TRITON_INTERPRET=1``) one Triton launch: each program owns ``BLOCK_N`` rows of
the weight and walks the reduction in steps of ``BLOCK_K`` fp8 inputs, widening them to float32
(one row of x: multiply-and-sum on the CUDA cores) or to x's dtype (several rows: ``tl.dot``
with the rows padded to 16; float32 products under the interpreter, whose widening of fp8 to
bf16 gives wrong values, and for float32 x), then scales its rows once. Elsewhere
:func:`fp8_logits_torch`, the reference: the same dequantized weight in float32 PyTorch ops (it
builds that float32 weight on every call: for tests and tiny models, not a CPU serving path).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.dispatch import INTERPRET
from mtpserve.kernels.pdl import pdl_wait

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0            # largest finite E4M3 value
MAX_ROWS = 16              # rows of x one launch takes (the dot path pads to 16)
# (BLOCK_N, BLOCK_K, warps, stages) for one row and for several, from benchmarks/gpu_fp8_head.py
# on an H100 (BENCHMARKS.md, session 36): one row of the 151936 x 2048 head 102.6 us (bf16 head
# 199.1), of a 32768-row FR-Spec head 24.6 (44.6); four rows 109.2 (202.5) and 28.3 (50.0)
ONE_ROW_TILES = (16, 512, 4, 2)
ROWS_TILES = (64, 256, 8, 3)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row FP8 E4M3 copy of ``weight`` [N, K] (any float dtype and device): returns
    (``w8`` [N, K] float8_e4m3fn, ``scale`` [N] float32) with ``w8[n] * scale[n]`` close to
    ``weight[n]`` (``scale[n]`` = the row's largest magnitude / 448; 1 for an all-zero row; a
    row holding inf or NaN gets a non-finite or meaningless scale, which only spoils drafts).
    Quantized in float32, in slices of rows, so a 152k-row head needs no float32 copy of
    itself. Raises ``ValueError`` for a weight that is not 2-D floating point with K > 0."""
    if weight.dim() != 2 or not weight.dtype.is_floating_point or weight.shape[1] == 0:
        raise ValueError(f"quantize_rows takes a 2-D float weight of K > 0 inputs, got "
                         f"{tuple(weight.shape)} {weight.dtype}")
    N, K = weight.shape
    w8 = torch.empty(N, K, dtype=FP8, device=weight.device)
    scale = torch.empty(N, dtype=torch.float32, device=weight.device)
    step = max(1, (1 << 22) // max(K, 1))   # 16 MiB of float32 a slice (a few such at once)
    for lo in range(0, N, step):
        w = weight[lo:lo + step].float()
        s = w.abs().amax(dim=1) / FP8_MAX
        s = torch.where(s > 0, s, torch.ones_like(s))
        w8[lo:lo + step] = (w / s[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        scale[lo:lo + step] = s
    return w8, scale


def fp8_logits_torch(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """:func:`fp8_logits` in PyTorch ops (the reference; the path off CUDA): the weight
    dequantized to float32 and multiplied in float32. [M, N] float32."""
    return x.float() @ (w8.float() * scale[:, None]).t()


@triton.jit
def _fp8_logits_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, sx, sw, sy, K: tl.constexpr,
                       ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       STAGES: tl.constexpr, WIDE: tl.constexpr, PDL: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live = n < N
    c = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + n[:, None].to(tl.int64) * sw
    pdl_wait(PDL)   # x is the kernel before's output; the weight never changes
    if ROWS == 1:
        acc = tl.zeros([BLOCK_N], tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            cols = k0 + c
            w = tl.load(w_rows + cols[None, :], mask=live[:, None] & (cols < K)[None, :],
                        other=0.0)
            x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
            acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        s = tl.load(s_ptr + n, mask=live, other=0.0)
        tl.store(y_ptr + n, acc * s, mask=live)
    else:
        m = tl.arange(0, ROWS)
        acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            cols = k0 + c
            x = tl.load(x_ptr + m[:, None] * sx + cols[None, :],
                        mask=(m < M)[:, None] & (cols < K)[None, :], other=0.0)
            w = tl.load(w_rows + cols[None, :], mask=live[:, None] & (cols < K)[None, :],
                        other=0.0)
            if WIDE:   # the interpreter: float32 products (its fp8 -> bf16 widening is wrong)
                acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc,
                             input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
        s = tl.load(s_ptr + n, mask=live, other=0.0)
        tl.store(y_ptr + m[:, None] * sy + n[None, :], acc * s[None, :],
                 mask=(m < M)[:, None] & live[None, :])


def fp8_logits(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor,
               tiles: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``x`` [M, K] (bf16 / fp16; float32 too, products then in float32) times the FP8 weight
    ``w8`` [N, K] float8_e4m3fn (rows contiguous) with its row scales ``scale`` [N] float32 (from
    :func:`quantize_rows`) -> float32 logits [M, N] (module doc). ``tiles``: (BLOCK_N, BLOCK_K,
    warps, stages), powers of two (default ``ONE_ROW_TILES`` for one row, ``ROWS_TILES`` for
    more; BLOCK_K at most K's next power of two, inputs past K masked). On CUDA or under
    ``TRITON_INTERPRET=1``: one Triton launch, CUDA-graph capturable; elsewhere
    :func:`fp8_logits_torch`.

    Raises ``ValueError`` for mismatched shapes or dtypes, more than ``MAX_ROWS`` rows, or a
    weight not contiguous along K."""
    M, K = x.shape if x.dim() == 2 else (0, -1)
    if (x.dim() != 2 or w8.dim() != 2 or w8.shape[1] != K or w8.dtype != FP8
            or scale.shape != (w8.shape[0],) or scale.dtype != torch.float32):
        raise ValueError(f"fp8_logits: x [M, K], w8 [N, K] {FP8}, scale [N] float32; got x "
                         f"{tuple(x.shape)}, w8 {tuple(w8.shape)} {w8.dtype}, scale "
                         f"{tuple(scale.shape)} {scale.dtype}")
    if M > MAX_ROWS or w8.stride(1) != 1:
        raise ValueError(f"fp8_logits takes at most {MAX_ROWS} rows of a weight contiguous "
                         f"along K; got {M} rows, weight strides {w8.stride()}")
    if not (x.is_cuda or INTERPRET):
        return fp8_logits_torch(x, w8, scale)
    N = w8.shape[0]
    block_n, block_k, warps, stages = tiles or (ONE_ROW_TILES if M == 1 else ROWS_TILES)
    block_k = min(block_k, max(16, triton.next_power_of_2(K)))
    x, scale = x.contiguous(), scale.contiguous()
    y = torch.empty(M, N, dtype=torch.float32, device=x.device)
    if M:
        _fp8_logits_kernel[(triton.cdiv(N, block_n),)](
            x, w8, scale, y, M, N, x.stride(0), w8.stride(0), y.stride(0), K=K,
            ROWS=1 if M == 1 else 16, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages,
            WIDE=not x.is_cuda or x.dtype == torch.float32, num_warps=warps, **pdl.launch(x))
    return y
