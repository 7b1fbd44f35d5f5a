"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer"), neox / rotate-half layout."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


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
    up once (``lookup(positions [T] int64)`` -> (cos, sin), each [T, 1, rotary_dim]) and every
    layer then calls ``apply(q [T, Hq, D], k [T, Hk, D], cos_sin)``, which returns rotated
    (q, k) with the same shapes and dtypes.
    """

    def __init__(self, head_dim: int, rotary_dim: int, max_position: int, hf_config: Any):
        super().__init__()
        self.head_dim, self.rotary_dim = head_dim, rotary_dim
        inv_freq, scaling = inverse_frequencies(hf_config, rotary_dim)
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype):
        return (self.cos[positions].unsqueeze(1).to(dtype),
                self.sin[positions].unsqueeze(1).to(dtype))

    def apply(self, q: torch.Tensor, k: torch.Tensor, cos_sin) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = cos_sin
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = self.rotary_dim
        rot = x[..., :r] if r != self.head_dim else x
        x1, x2 = rot.chunk(2, dim=-1)
        out = rot * cos + torch.cat([-x2, x1], dim=-1) * sin
        if r == self.head_dim:
            return out
        return torch.cat([out, x[..., r:]], dim=-1)
