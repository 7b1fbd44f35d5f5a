"""Recurrent-state rollback after a verify step in one copy: scratch position -> state slot.

After a verify step each sequence keeps the state after its last accepted token, which the
verify forward left at position ``positions[b]`` of its scratch row (engine/state_cache.py).
With the acceptance known only on the device, PyTorch needs ``index_select`` of those positions
into a temporary, then ``index_copy_`` into the slots: the state read and written twice, 36 us
of device time per step for the 19 MB of the ``qwen3-next-3b`` shape's SSM states (session 30's
step traces), and five host calls. This kernel reads each (layer, sequence) state once from
its scratch position and writes it into its slot, both state kinds in one launch.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from mtpserve.kernels.jit_options import unspecialized

BLOCK = 4096     # elements a program copies


@triton.jit
def _copy_chunk(src_ptr, dst_ptr, layer, row, pos, slot, chunk, R, P, S, E,
                BLOCK: tl.constexpr):
    """Chunk ``chunk`` of (layer, scratch row, position)'s state into (layer, slot)."""
    src = src_ptr + ((layer.to(tl.int64) * R + row) * P + pos) * E
    dst = dst_ptr + (layer.to(tl.int64) * S + slot) * E
    k = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = k < E
    tl.store(dst + k, tl.load(src + k, mask=mask), mask=mask)


@triton.jit(**unspecialized(ints=("B", "chunks_a")))
def _commit_kernel(src_a, dst_a, src_b, dst_b, rows_ptr, pos_ptr, slots_ptr, B, R, P, S,
                   E_a, E_b, chunks_a, BLOCK: tl.constexpr):
    chunk, b, layer = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row = tl.load(rows_ptr + b).to(tl.int64)
    pos = tl.load(pos_ptr + b).to(tl.int64)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    if chunk < chunks_a:     # the first state kind's chunks, then the second's
        _copy_chunk(src_a, dst_a, layer, row, pos, slot, chunk, R, P, S, E_a, BLOCK)
    else:
        _copy_chunk(src_b, dst_b, layer, row, pos, slot, chunk - chunks_a, R, P, S, E_b, BLOCK)


def commit_states(pairs: list[tuple[torch.Tensor, torch.Tensor]], slots: torch.Tensor,
                  rows: torch.Tensor, positions: torch.Tensor) -> None:
    """``pool[:, slots[b]] = scratch[:, rows[b], positions[b]]`` for every b and every
    (pool, scratch) of ``pairs`` (one or two state kinds, e.g. conv and SSM), on the device in
    one launch.

    Args:
        pairs: (pool [L, S, ...], scratch [L, R, P, ...]): a state kind of every layer and its
            per-position states (contiguous, same trailing shape and dtype; every pair the
            same L, S, R and P); slots, rows, positions: [B] integer tensors on the device
            (slots distinct).

    Raises:
        ValueError: shapes, dtypes or layouts that do not match, or not one or two pairs.
    """
    if len(pairs) not in (1, 2):
        raise ValueError(f"commit_states: one or two (pool, scratch) pairs, not {len(pairs)}")
    for pool, scratch in pairs:
        _check(pool, scratch, pairs[0], slots, rows, positions)
    (pool_a, scratch_a), (pool_b, scratch_b) = pairs[0], pairs[-1]
    L, S = pool_a.shape[:2]
    B, (R, P) = slots.shape[0], scratch_a.shape[1:3]
    E_a, E_b = math.prod(pool_a.shape[2:]), math.prod(pool_b.shape[2:])
    if B == 0:
        return
    chunks_a = triton.cdiv(E_a, BLOCK)
    chunks_b = triton.cdiv(E_b, BLOCK) if len(pairs) == 2 else 0
    _commit_kernel[(chunks_a + chunks_b, B, L)](
        scratch_a, pool_a, scratch_b, pool_b, rows, positions, slots, B, R, P, S, E_a, E_b,
        chunks_a, BLOCK=BLOCK)


def _check(pool, scratch, first, slots, rows, positions) -> None:
    L, S = first[0].shape[:2]
    if (scratch.dim() != pool.dim() + 1 or pool.shape[:2] != (L, S)
            or scratch.shape[:3] != first[1].shape[:3]
            or scratch.shape[3:] != pool.shape[2:] or scratch.dtype != pool.dtype
            or not (pool.is_contiguous() and scratch.is_contiguous())
            or not slots.shape == rows.shape == positions.shape):
        raise ValueError(f"commit_states: pool {tuple(pool.shape)} {pool.dtype} and scratch "
                         f"{tuple(scratch.shape)} {scratch.dtype} (both contiguous, the "
                         f"first pair's layers, slots, rows and positions) or indices "
                         f"{tuple(slots.shape)} / {tuple(rows.shape)} / "
                         f"{tuple(positions.shape)} do not match")
