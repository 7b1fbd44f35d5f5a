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

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens_cpu)


def to_device(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list of ints as a 1-D tensor on ``device``; on CUDA through the process's pinned
    ring (engine/pinned_staging.py) without blocking the host. Building a CUDA tensor straight
    from a list, or indexing one with a list, waits instead."""
    if torch.device(device).type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return staging_for(device).upload(values, dtype)


class HostCopy:
    """A device tensor's values on their way to the host. On CUDA a non-blocking copy into
    pinned memory is queued at construction, right behind the work that makes them, with an
    event after it: :meth:`tolist` then waits for that copy alone, not for work queued later.
    Elsewhere the tensor itself is read.

    Args:
        x: the tensor (any shape and dtype).
    """

    def __init__(self, x: torch.Tensor):
        self._host, self._ready = x, None
        if x.is_cuda:
            self._host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            self._host.copy_(x, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()

    def tolist(self) -> list:
        """The values as (nested) Python numbers (on CUDA: once the copy has run)."""
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()
