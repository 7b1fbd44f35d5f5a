"""RMSNorm (Zhang & Sennrich 2019), in the two weight conventions the supported models use."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mtpserve.kernels.dispatch import use_triton


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x^2) + eps) * w``, computed in float32 and cast back to x's dtype.

    ``zero_centered=True`` stores ``w - 1`` (Qwen3-Next / Qwen3.5), so the scale is ``1 + w``.

    ``forward(x)``: x [..., hidden] any float dtype -> y, same shape and dtype.
    ``forward(x, residual)`` (residual like x): the pre-norm decoder's residual add fused in
    front of the norm (as vLLM / SGLang's ``fused_add_rms_norm``): ``s = residual + x`` in x's
    dtype, returns ``(norm(s), s)``; on CUDA one Triton kernel, on the CPU exactly the two ops.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, zero_centered: bool = False):
        super().__init__()
        init = torch.zeros if zero_centered else torch.ones
        self.weight = nn.Parameter(init(hidden_size))
        self.eps = eps
        self.zero_centered = zero_centered

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self._norm(x)
        return self.add_norm(x, residual)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor | None):
        """``(norm(residual + x), residual + x)``; with no residual yet (a decoder's first layer,
        or a model without layers) ``(norm(x), x)``. ``x`` may be a split product's partials
        (``gemv_triton.SplitKPartials``, CUDA): the fused kernel sums them."""
        if hasattr(x, "total") and (residual is None or not use_triton(residual)):
            x = x.total()
        if residual is None:
            return self._norm(x), x
        if use_triton(x):
            from mtpserve.kernels import fused_triton

            return fused_triton.add_rms_norm(x, residual, self.weight, self.eps,
                                             self.zero_centered)
        s = residual + x
        return self._norm(s), s

    def add_norm_into(self, x, residual: torch.Tensor | None, weight: torch.Tensor):
        """:meth:`add_norm` for a product by ``weight`` next: where that product can take the
        residual add and the norm in its own programs (``gemv_triton.fused_input_fits``: one row
        on CUDA, a streamed product; not zero-centred), returns ``(NormInput, residual)``, the
        residual tensor written when the product runs; else ``add_norm(x, residual)``."""
        if (residual is not None and not self.zero_centered and isinstance(x, torch.Tensor)
                and use_triton(x) and residual.shape == x.shape):
            from mtpserve.kernels.gemv_stream_triton import NormInput
            from mtpserve.kernels.gemv_triton import fused_input_fits

            if fused_input_fits(x, weight, norm=True):
                out = torch.empty_like(residual)
                return NormInput(x, residual, self.weight, self.eps, out), out
        return self.add_norm(x, residual)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x):
            from mtpserve.kernels import fused_triton

            return fused_triton.rms_norm(x, self.weight, self.eps, self.zero_centered)
        if not self.zero_centered:
            # one C++ op; bit-identical to the float32 formula below for float32 input
            return F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype) * self.weight
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)
