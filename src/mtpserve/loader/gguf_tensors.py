"""GGUF tensors -> HF-named float32 torch tensors, dequantized one at a time."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator

import gguf
import numpy as np
import torch
from gguf.quants import dequantize

from .gguf_names import SKIPPED_TENSORS, hf_name, permute_heads, unpermute_rows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannedTensor:
    """One GGUF tensor's way out: its HF ``name``, HF ``shape`` (row-major, ggml's axes reversed)
    and the head count to unpermute its rows with (None: rows already in HF order)."""

    tensor: Any  # gguf.ReaderTensor
    name: str
    shape: tuple[int, ...]
    heads: int | None


def tensor_plan(reader: gguf.GGUFReader, arch: str, n_heads: int, n_kv_heads: int,
                path: str) -> list[PlannedTensor]:
    """Plan the conversion of every tensor of ``reader`` (file order), skipping ``SKIPPED_TENSORS``.

    Raises:
        ValueError: for a tensor with no HF name (the message names ``path``).
    """
    plan = []
    for t in reader.tensors:
        if t.name in SKIPPED_TENSORS:
            log.warning("%s: dropping %s (llama3 rope frequency factors are not supported)", path, t.name)
            continue
        try:
            name = hf_name(t.name)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        plan.append(PlannedTensor(t, name, shape, permute_heads(t.name, arch, n_heads, n_kv_heads)))
    return plan


def dequantized(p: PlannedTensor) -> torch.Tensor:
    """The tensor of ``p`` as a new float32 CPU tensor of shape ``p.shape``, dequantized with
    ``gguf.quants.dequantize`` and, for llama q/k, rows put back in HF order."""
    arr = dequantize(p.tensor.data, p.tensor.tensor_type)
    if arr.dtype != np.float32 or not arr.flags.writeable:  # F16 / BF16, or a view of the mmap
        arr = arr.astype(np.float32)
    w = torch.from_numpy(arr).reshape(p.shape)
    return unpermute_rows(w, p.heads) if p.heads is not None else w


def iter_planned(plan: list[PlannedTensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, float32 tensor)`` for each planned tensor, one at a time."""
    for p in plan:
        yield p.name, dequantized(p)
