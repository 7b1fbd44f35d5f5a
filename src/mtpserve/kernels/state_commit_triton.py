"""Recurrent-state rollback after a verify step in one copy: scratch position -> state slot.

After a verify step each sequence keeps the state after its last accepted token, which the
verify forward left at position ``positions[b]`` of its scratch row (engine/state_cache.py).
With the acceptance known only on the device, PyTorch needs ``index_select`` of those positions
into a temporary, then ``index_copy_`` into the slots: the state read and written twice, 36 us
of device time per step for the 19 MB of the ``qwen3-next-3b`` shape's SSM states (session 30's
step traces), and five host calls. This kernel reads each (layer, sequence) state once from
its scratch position and writes it into its slot: one launch per state kind.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from mtpserve.kernels.jit_options import unspecialized

BLOCK = 4096     # elements a program copies


@triton.jit(**unspecialized(ints=("B",)))
def _commit_kernel(src_ptr, dst_ptr, rows_ptr, pos_ptr, slots_ptr, B, R, P, S, E,
                   BLOCK: tl.constexpr):
    chunk, b, layer = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row = tl.load(rows_ptr + b).to(tl.int64)
    pos = tl.load(pos_ptr + b).to(tl.int64)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    src = src_ptr + ((layer.to(tl.int64) * R + row) * P + pos) * E
    dst = dst_ptr + (layer.to(tl.int64) * S + slot) * E
    k = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = k < E
    tl.store(dst + k, tl.load(src + k, mask=mask), mask=mask)


def commit_states(pool: torch.Tensor, scratch: torch.Tensor, slots: torch.Tensor,
                  rows: torch.Tensor, positions: torch.Tensor) -> None:
    """``pool[:, slots[b]] = scratch[:, rows[b], positions[b]]`` for every b, on the device.

    Args:
        pool: [L, S, ...] one state kind of every layer (contiguous); scratch: [L, R, P, ...]
            its per-position states (contiguous, same trailing shape and dtype); slots, rows,
            positions: [B] integer tensors on the device (slots distinct).

    Raises:
        ValueError: shapes, dtypes or layouts that do not match.
    """
    L, S = pool.shape[:2]
    if (scratch.dim() != pool.dim() + 1 or scratch.shape[0] != L
            or scratch.shape[3:] != pool.shape[2:] or scratch.dtype != pool.dtype
            or not (pool.is_contiguous() and scratch.is_contiguous())
            or not slots.shape == rows.shape == positions.shape):
        raise ValueError(f"commit_states: pool {tuple(pool.shape)} {pool.dtype} and scratch "
                         f"{tuple(scratch.shape)} {scratch.dtype} (both contiguous) or indices "
                         f"{tuple(slots.shape)} / {tuple(rows.shape)} / "
                         f"{tuple(positions.shape)} do not match")
    B, (R, P), E = slots.shape[0], scratch.shape[1:3], math.prod(pool.shape[2:])
    if B == 0:
        return
    _commit_kernel[(triton.cdiv(E, BLOCK), B, L)](
        scratch, pool, rows, positions, slots, B, R, P, S, E, BLOCK=BLOCK)
