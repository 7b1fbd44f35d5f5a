"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer"), neox / rotate-half layout."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mtpserve.kernels.dispatch import use_triton


def _rope_parameters(hf_config: Any) -> dict:
    params = getattr(hf_config, "rope_parameters", None) or {}
    if not params:  # older configs: rope_theta + rope_scaling
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params = dict(params)
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def inverse_frequencies(hf_config: Any, rotary_dim: int) -> tuple[torch.Tensor, float]:
    """Per-pair inverse frequencies [rotary_dim // 2] float32 and the cos/sin scaling factor.

    ``default`` RoPE is ``theta ** (-2i / rotary_dim)``; scaled variants (linear, llama3, yarn,
    longrope) come from transformers' ``ROPE_INIT_FUNCTIONS``, which read the same config.

    Raises:
        ValueError: for rope types whose frequencies change with sequence length (``dynamic``).
    """
    params = _rope_parameters(hf_config)
    rope_type = params["rope_type"]
    if rope_type == "default":
        exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim
        return 1.0 / (float(params["rope_theta"]) ** exponent), 1.0
    if rope_type == "dynamic":
        raise ValueError("dynamic NTK rope scaling is not supported (frequencies depend on length)")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to the first ``rotary_dim`` channels of each head (the rest pass through).

    cos/sin are precomputed in float32 for ``max_position`` positions. A forward pass looks them
    up once (``lookup(positions [T] int64, dtype)``) and every layer then calls
    ``apply(x [T, H, D], cos_sin)`` on its queries and keys stacked along H, which returns the
    rotated tensor (same shape and dtype).
    """

    def __init__(self, head_dim: int, rotary_dim: int, max_position: int, hf_config: Any):
        super().__init__()
        self.head_dim, self.rotary_dim = head_dim, rotary_dim
        inv_freq, scaling = inverse_frequencies(hf_config, rotary_dim)
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        sign = torch.cat([-torch.ones(rotary_dim // 2), torch.ones(rotary_dim // 2)])
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("signed_sin", emb.sin() * scaling * sign, persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype):
        """Per-step tables: (cos, signed sin, positions), cos / sin [T, 1, rotary_dim] in
        ``dtype``, their first-half sin negated so that rotate_half(x) * sin ==
        roll(x, rotary_dim / 2) * signed_sin. On CUDA the fused kernel reads the float32 tables
        by position itself, and cos / sin are None."""
        if use_triton(positions):
            return None, None, positions
        return (self.cos[positions].unsqueeze(1).to(dtype),
                self.signed_sin[positions].unsqueeze(1).to(dtype), positions)

    def apply(self, x: torch.Tensor, rope) -> torch.Tensor:
        """Rotate ``x`` [T, H, D] (queries and keys may be stacked along H)."""
        cos, sin, positions = rope
        if cos is None:
            from mtpserve.kernels import fused_triton

            return fused_triton.rotary(x, positions, self.cos, self.signed_sin)
        r = self.rotary_dim
        rot = x[..., :r] if r != self.head_dim else x
        out = rot * cos + rot.roll(r // 2, dims=-1) * sin
        if r == self.head_dim:
            return out
        return torch.cat([out, x[..., r:]], dim=-1)
