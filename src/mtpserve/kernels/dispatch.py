"""Whether a tensor's op should take the Triton kernel (CUDA with Triton installed) or the
plain-PyTorch reference."""

from __future__ import annotations

import functools
import os

import torch

# Triton's CPU interpreter (tests): kernels run on CPU tensors, programs one after another
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and triton_available()


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight^T`` should take the skinny Triton product (kernels/gemv_triton.py)."""
    if not (x.is_cuda and triton_available()):
        return False
    from mtpserve.kernels import gemv_triton

    return gemv_triton.use_gemv(x, weight)
