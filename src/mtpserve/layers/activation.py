"""Gated activations."""

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
