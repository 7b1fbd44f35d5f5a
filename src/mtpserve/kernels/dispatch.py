"""Whether a tensor's op should take the Triton kernel (CUDA with Triton installed) or the
plain-PyTorch reference."""

from __future__ import annotations

import functools

import torch


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and triton_available()
