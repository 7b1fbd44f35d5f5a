"""Gated activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mtpserve.kernels.dispatch import use_triton


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU gate (Shazeer 2020): ``silu(x[..., :d]) * x[..., d:]``; [..., 2d] -> [..., d] in
    x's dtype (one Triton kernel on CUDA for 2-D ``x``)."""
    if use_triton(x) and x.dim() == 2:
        from mtpserve.kernels import fused_triton

        return fused_triton.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up

