"""Gated activations, and the interleaved gate/up row order that lets the skinny product apply
SiLU-and-mul in its epilogue (kernels/gemv_triton.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mtpserve.kernels.dispatch import use_triton


class SiluAndMul(nn.Module):
    """SwiGLU gate (Shazeer 2020): ``silu(x[..., :d]) * x[..., d:]``; [..., 2d] -> [..., d]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x) and x.dim() == 2:
            from mtpserve.kernels import fused_triton

            return fused_triton.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


def silu_and_mul_interleaved(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., 0::2]) * x[..., 1::2]``: [..., 2d] -> [..., d], for the output of a gate/up
    product whose weight rows were interleaved (:func:`interleave_gate_up`)."""
    if use_triton(x) and x.dim() == 2:
        from mtpserve.kernels import fused_triton

        return fused_triton.silu_and_mul(x, interleaved=True)
    # back to (gates, ups) in SiluAndMul's layout: PyTorch's CPU SiLU rounds by layout
    gate, up = x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2).chunk(2, dim=-1)
    return F.silu(gate) * up


def interleave_gate_up(t: torch.Tensor) -> torch.Tensor:
    """A stacked gate/up weight [2d, ...] (or bias [2d]: gate rows, then up rows) reordered so
    that row 2j is gate row j and row 2j + 1 up row j; a new tensor of the same shape."""
    return t.unflatten(0, (2, -1)).transpose(0, 1).reshape(t.shape)


def deinterleave_gate_up(t: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`interleave_gate_up`: gate rows, then up rows."""
    return t.unflatten(0, (-1, 2)).transpose(0, 1).reshape(t.shape)
