"""The end of a sparse MoE block in one Triton kernel (CUDA): each token's routed expert
outputs summed over its k choices, plus the gated shared expert (or, where the shared expert
ran as one more choice, the sum alone).

``out[t] = sum_c y[t * k + c] + shared[t] * gate[t]`` (Qwen2-MoE / Qwen3-Next layout, layers/
moe.py), where PyTorch takes two kernels a layer (the sum over choices, 4.6 us on the H200 at
one token, and ``addcmul``, 2.2 us; BENCHMARKS.md session 30). Rounding as those two ops: the
sum accumulated in float32 and rounded to the model dtype, then ``routed + shared * gate`` in
float32 with one rounding. Session 30 folded the same sum into the down product instead (one
program per 16 outputs reading the k experts in turn) and lost 70 us a forward: this kernel
leaves the product alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.pdl import pdl_wait

BLOCK = 256   # outputs a program: 8 programs a token at H 2048


@triton.jit
def _combine_kernel(y_ptr, s_ptr, g_ptr, o_ptr, H, K: tl.constexpr, BLOCK: tl.constexpr,
                    SHARED: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c in tl.static_range(K):
        acc += tl.load(y_ptr + (t * K + c) * H + cols, mask=m, other=0.0).to(tl.float32)
    if SHARED:
        routed = acc.to(o_ptr.dtype.element_ty).to(tl.float32)
        shared = tl.load(s_ptr + t * H + cols, mask=m, other=0.0).to(tl.float32)
        gate = tl.load(g_ptr + t).to(tl.float32)
        acc = routed + shared * gate
    tl.store(o_ptr + t * H + cols, acc.to(o_ptr.dtype.element_ty), mask=m)


def moe_combine(per_choice: torch.Tensor, shared: torch.Tensor | None = None,
                gate: torch.Tensor | None = None, k: int | None = None) -> torch.Tensor:
    """``per_choice.view(T, k, H).sum(1) + shared * gate`` in one kernel; without ``shared``
    and ``gate`` the sum alone (a shared expert run as one of the choices, layers/moe.py).

    Args:
        per_choice: [T * k, H] each (token, choice)'s weighted expert output, token-major,
            contiguous, model dtype.
        shared: [T, H] the shared expert's output, contiguous, same dtype (or None).
        gate: [T, 1] (or [T]) the shared expert gate, same dtype (with ``shared``).
        k: choices a token (needed without ``shared``, which gives T).

    Returns:
        [T, H] in the model dtype.

    Raises:
        ValueError: for shapes, dtypes or layouts that do not fit (checked on the host).
    """
    if (shared is None) != (gate is None) or (shared is None and not k):
        raise ValueError("moe_combine takes shared and gate together, or neither and k")
    H = per_choice.shape[1]
    T = shared.shape[0] if shared is not None else per_choice.shape[0] // k
    if T == 0:
        return per_choice.new_empty(0, H)
    if per_choice.shape[0] % T or (shared is not None and shared.shape != (T, H)) \
            or (k and per_choice.shape[0] != T * k):
        raise ValueError(f"per_choice {tuple(per_choice.shape)} is not [T * k, {H}] for T {T}")
    ops = [per_choice] if shared is None else [per_choice, shared, gate]
    if gate is not None and gate.numel() != T:
        raise ValueError(f"gate {tuple(gate.shape)} is not [{T}, 1]")
    if not all(o.is_contiguous() for o in ops):
        raise ValueError("an operand is not contiguous")
    if any(o.dtype != per_choice.dtype for o in ops):
        raise ValueError(f"dtypes differ: {', '.join(str(o.dtype) for o in ops)}")
    out = per_choice.new_empty(T, H)
    has_shared = shared is not None
    _combine_kernel[(T, triton.cdiv(H, BLOCK))](
        per_choice, shared if has_shared else out, gate if has_shared else out, out, H,
        K=per_choice.shape[0] // T, BLOCK=BLOCK, SHARED=has_shared, **pdl.launch(per_choice))
    return out
