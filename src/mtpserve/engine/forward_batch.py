"""The one object a model forward reads its batch layout from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mtpserve.engine.pinned_staging import staging_for


@dataclass
class ForwardBatch:
    """A flattened (varlen) batch of B sequences and T tokens for one forward pass.

    Tokens of sequence b occupy ``query_start_loc[b]:query_start_loc[b+1]`` of the flat dimension.

    - ``input_ids`` [T] int64, ``positions`` [T] int64 (position of each token in its sequence).
    - ``slot_mapping`` [T] int64: flat KV-cache slot (``block * block_size + offset``) each token's
      K/V is written to.
    - ``query_lens`` [B] int64 (host list ``query_lens_cpu`` too); ``seq_lens`` [B] int64: context
      length of each sequence *after* this step's tokens (``seq_lens_cpu``).
    - ``block_tables`` [B, max_blocks] int32: KV blocks of each sequence, padded with 0.
    - ``logits_indices`` [N] int64: flat token indices whose hidden states become logits.
    - ``attn``: backend-specific attention metadata, built once per step and shared by all layers.
    - ``kv_caches``: per attention layer, its (K, V) cache tensors [num_slots, Hkv, D].
    - ``extra``: per-model additions (recurrent-state slots of hybrid models, MTP inputs).
    - ``token_io`` [3T] int64 or None: ``input_ids``, ``positions`` and ``slot_mapping`` back
      to back (those three are views of it), so a CUDA graph takes them in one copy;
      ``block_tables_cpu``: ``block_tables`` as a flat host list (row-major) or None; a graph
      skips the copy when its input already holds these values (engine/graph_inputs.py).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    query_lens: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    logits_indices: torch.Tensor
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    attn: Any = None
    kv_caches: list = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    token_io: torch.Tensor | None = None
    block_tables_cpu: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens_cpu)


def to_device(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list (or 1-D numpy array) of ints as a 1-D tensor on ``device``; on CUDA through
    the process's pinned ring (engine/pinned_staging.py) without blocking the host. Building a
    CUDA tensor straight from a list, or indexing one with a list, waits instead."""
    if torch.device(device).type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return staging_for(device).upload(values, dtype)


def to_device_into(dst: torch.Tensor, values: list[int]) -> None:
    """Write the host list ``values`` into the contiguous 1-D tensor ``dst`` (same length): on
    CUDA one asynchronous copy from the process's pinned ring, without blocking the host."""
    if dst.device.type != "cuda":
        dst.copy_(torch.tensor(values, dtype=dst.dtype))
        return
    staging_for(dst.device).upload_into(dst, values)


class HostCopy:
    """A device tensor's values on their way to the host. On CUDA a non-blocking copy into
    pinned memory is queued at construction, right behind the work that makes them, with an
    event after it: :meth:`tolist` then waits for that copy alone, not for work queued later.
    Elsewhere the tensor itself is read.

    The pinned buffer comes from a small pool by shape and dtype and goes back to it once
    :meth:`tolist` has read it (a new pinned block cost ~18 us of host time a copy on the
    H200 host, session 30's benchmarks/host_calls.py; a step makes two).

    Args:
        x: the tensor (any shape and dtype).
    """

    def __init__(self, x: torch.Tensor):
        self._host, self._ready, self._values = x, None, None
        if x.is_cuda:
            self._host = _pinned_take(x.shape, x.dtype)
            self._host.copy_(x, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()

    def tolist(self) -> list:
        """The values as (nested) Python numbers (on CUDA: once the copy has run). The same
        list on every call: callers must not change it."""
        if self._values is None:
            if self._ready is not None:
                self._ready.synchronize()
            self._values = self._host.tolist()
            if self._ready is not None:   # read: the buffer may take another copy
                _pinned_give(self._host)
            self._host = None
        return self._values


_PINNED_POOL: dict[tuple, list[torch.Tensor]] = {}
_POOL_DEPTH = 8   # buffers kept per (shape, dtype): a step has ~2 copies in flight


def _pinned_take(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A pinned host tensor of ``shape`` and ``dtype``: from the pool, else a new one."""
    free = _PINNED_POOL.get((tuple(shape), dtype))
    if free:
        return free.pop()
    # a normal tensor even when made under inference_mode: a pooled buffer is written again
    # by copies that may run outside it, which an inference tensor refuses
    with torch.inference_mode(False):
        return torch.empty(shape, dtype=dtype, pin_memory=True)


def _pinned_give(buf: torch.Tensor) -> None:
    """Return ``buf`` (read, no copy into it pending) to the pool."""
    free = _PINNED_POOL.setdefault((tuple(buf.shape), buf.dtype), [])
    if len(free) < _POOL_DEPTH:
        free.append(buf)
