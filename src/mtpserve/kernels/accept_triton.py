"""Greedy acceptance of a uniform verify batch in one Triton kernel (CUDA).

B sequences verify k drafts each, back to back: sequence b's tokens are its newest token then
its drafts (``input_ids[b (k + 1) ..]``) and its targets are the target model's choices after
each (``targets[b (k + 1) ..]``). Drafts are accepted up to the first one that differs from
the target before it (speculative decoding with greedy verification; Leviathan et al. 2023).
PyTorch takes a compare, a cast, a cumulative product and a sum (4 kernels inside the verify
graph); here one program per sequence finds the first mismatch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.pdl import pdl_wait


@triton.jit
def _accept_kernel(ids_ptr, tgt_ptr, out_ptr, K: tl.constexpr, BLOCK: tl.constexpr,
                   PDL: tl.constexpr):
    pdl_wait(PDL)
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    m = i < K
    draft = tl.load(ids_ptr + b * (K + 1) + 1 + i, mask=m, other=0)
    target = tl.load(tgt_ptr + b * (K + 1) + i, mask=m, other=0)
    first_miss = tl.min(tl.where(m & (draft != target), i, K), 0)
    tl.store(out_ptr + b, first_miss.to(tl.int64))


def accepted_prefix(input_ids: torch.Tensor, targets: torch.Tensor, B: int, k: int,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Drafts accepted per sequence: the length of the longest prefix of ``drafts[b] ==
    targets[b]``.

    Args:
        input_ids, targets: [B (k + 1)] int64, contiguous, on one CUDA device (or the CPU under
            Triton's interpreter); B sequences of k >= 1 drafts each, back to back.
        out: [B] int64 to write (default: a new tensor).

    Returns:
        [B] int64, each in 0..k.

    Raises:
        ValueError: for shapes, dtypes or layouts that do not fit.
    """
    n = B * (k + 1)
    if k < 1 or input_ids.shape != (n,) or targets.shape != (n,) \
            or input_ids.dtype != torch.int64 or targets.dtype != torch.int64 \
            or not (input_ids.is_contiguous() and targets.is_contiguous()):
        raise ValueError(f"input_ids {tuple(input_ids.shape)} {input_ids.dtype}, targets "
                         f"{tuple(targets.shape)} {targets.dtype}: expected contiguous [{n}] "
                         f"int64 for {B} sequences of {k} drafts")
    if out is None:
        out = torch.empty(B, dtype=torch.int64, device=input_ids.device)
    elif out.shape != (B,) or out.dtype != torch.int64 or not out.is_contiguous():
        raise ValueError(f"out {tuple(out.shape)} {out.dtype}: expected contiguous [{B}] int64")
    if B:
        _accept_kernel[(B,)](input_ids, targets, out, K=k, BLOCK=triton.next_power_of_2(k),
                             **pdl.launch(input_ids))
    return out
