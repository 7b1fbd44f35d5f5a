"""Fused elementwise kernels for CUDA (Triton): RMSNorm, SiLU-and-mul, rotary embedding.

Each replaces several PyTorch kernels with one, which matters inside a CUDA graph of a small
model where a decode step is mostly many tiny kernels. The plain-PyTorch versions in
``layers/norm.py``, ``layers/activation.py`` and ``layers/rotary.py`` are the CPU path and the
references these are tested against (tests/test_gpu.py). All arithmetic is float32 with one
rounding to the output dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, o_ptr, sx, so, n, eps, ZERO_CENTERED: tl.constexpr,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * r * (1.0 + w) if ZERO_CENTERED else x * r * w
    tl.store(o_ptr + row * so + cols, y.to(o_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` [..., N] (any float dtype); same shape and dtype."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    n = shape[-1]
    _rms_norm_kernel[(x2.shape[0],)](x2, weight, out, x2.stride(0), out.stride(0), n, eps,
                                     ZERO_CENTERED=zero_centered,
                                     BLOCK=triton.next_power_of_2(n))
    return out.view(shape)


@triton.jit
def _silu_mul_kernel(x_ptr, o_ptr, sx, so, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * sx + n + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(o_ptr + row * so + cols, y.to(o_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :n]) * x[:, n:]`` for ``x`` [T, 2n]; returns [T, n]."""
    T, two_n = x.shape
    n = two_n // 2
    out = torch.empty(T, n, dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul_kernel[(T, triton.cdiv(n, block))](x, out, x.stride(0), out.stride(0), n,
                                                 BLOCK=block)
    return out


@triton.jit
def _rotary_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, o_ptr, sx_t, sx_h, so_t, so_h, s_tab,
                   D: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                   REST_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + t)
    i = tl.arange(0, HALF_PAD)
    m = i < HALF
    xb = x_ptr + t * sx_t + h * sx_h
    ob = o_ptr + t * so_t + h * so_h
    x1 = tl.load(xb + i, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(xb + HALF + i, mask=m, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + pos * s_tab + i, mask=m, other=0.0)
    s = tl.load(sin_ptr + pos * s_tab + HALF + i, mask=m, other=0.0)   # the unsigned half
    tl.store(ob + i, (x1 * c - x2 * s).to(o_ptr.dtype.element_ty), mask=m)
    tl.store(ob + HALF + i, (x2 * c + x1 * s).to(o_ptr.dtype.element_ty), mask=m)
    if REST_PAD > 0:  # channels past the rotary part pass through
        r = 2 * HALF + tl.arange(0, REST_PAD)
        rm = r < D
        tl.store(ob + r, tl.load(xb + r, mask=rm, other=0.0), mask=rm)


def rotary(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
           signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, H, D] (neox layout) by the float32 tables [max_pos, rotary_dim] at
    ``positions`` [T]; ``signed_sin`` has its first half negated (layers/rotary.py)."""
    T, H, D = x.shape
    rot = cos.shape[1]
    out = torch.empty(T, H, D, dtype=x.dtype, device=x.device)
    rest = D - rot
    _rotary_kernel[(T, H)](x, positions, cos, signed_sin, out, x.stride(0), x.stride(1),
                           out.stride(0), out.stride(1), cos.stride(0), D=D, HALF=rot // 2,
                           HALF_PAD=triton.next_power_of_2(rot // 2),
                           REST_PAD=triton.next_power_of_2(rest) if rest else 0)
    return out
