"""The output gate of Qwen3-Next / Qwen3.5's gated attention in one Triton kernel (CUDA).

``out * sigmoid(gate)`` (Qiu et al. 2025, "Gated Attention for Large Language Models"), with the
gate read in place from the q/k/v product, where each query head's gate follows its query
(layers/gated_attention.py). PyTorch needs a copy of the strided gate, a sigmoid and a product:
three kernels a layer. Rounding as PyTorch's ``out * torch.sigmoid(gate)`` in the model dtype:
the sigmoid rounded to the dtype, then the product (float32 arithmetic, one rounding each).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.pdl import pdl_wait


@triton.jit
def _output_gate_kernel(o_ptr, g_ptr, so, sg_t, sg_h, D: tl.constexpr, BLOCK_D: tl.constexpr,
                        PDL: tl.constexpr):
    """One (token, head): ``o[t, h] *= sigmoid(g[t, h])`` over the head's D channels."""
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    m = d < D
    o_row = o_ptr + t * so + h * D
    g = tl.load(g_ptr + t * sg_t + h * sg_h + d, mask=m, other=0.0).to(tl.float32)
    o = tl.load(o_row + d, mask=m, other=0.0).to(tl.float32)
    s = (1.0 / (1.0 + tl.exp(-g))).to(o_ptr.dtype.element_ty).to(tl.float32)
    tl.store(o_row + d, (o * s).to(o_ptr.dtype.element_ty), mask=m)


def output_gate_(out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``out *= sigmoid(gate)`` in place; returns ``out``.

    Args:
        out: [T, Hq * D] attention output, contiguous, model dtype (float32 / bfloat16 /
            float16).
        gate: [T, Hq, D] in out's dtype, any strides but unit stride along D (a view of the
            q/k/v product: the gate of head h at ``h * 2D + D`` of a row).

    Raises:
        ValueError: for shapes, dtypes or strides that do not fit (checked on the host).
    """
    T, Hq, D = gate.shape
    if out.shape != (T, Hq * D) or not out.is_contiguous() or gate.stride(-1) != 1 \
            or gate.dtype != out.dtype:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} / gate {tuple(gate.shape)} "
                         f"stride {gate.stride()} {gate.dtype}: expected a contiguous "
                         f"[T, Hq * D] out and a [T, Hq, D] gate of its dtype, unit stride in D")
    if T:
        _output_gate_kernel[(T, Hq)](out, gate, out.stride(0), gate.stride(0), gate.stride(1),
                                     D=D, BLOCK_D=triton.next_power_of_2(D), **pdl.launch(out))
    return out
