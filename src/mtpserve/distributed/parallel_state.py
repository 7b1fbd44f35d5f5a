"""Who am I in the tensor-parallel group.

Layers ask these functions instead of carrying rank arguments, so a model file reads the same at
TP=1 and TP=8 (vLLM's design). Until ``init_tensor_parallel`` is called, rank 0 of size 1.
"""

from __future__ import annotations

import torch

_TP_RANK = 0
_TP_SIZE = 1
_TP_GROUP = None


def init_tensor_parallel(rank: int, size: int, group=None) -> None:
    """Record this process's TP rank and size and its ``torch.distributed`` group."""
    global _TP_RANK, _TP_SIZE, _TP_GROUP
    _TP_RANK, _TP_SIZE, _TP_GROUP = rank, size, group


def get_tp_rank() -> int:
    return _TP_RANK


def get_tp_size() -> int:
    return _TP_SIZE


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the TP group in place (identity at TP=1)."""
    if _TP_SIZE == 1:
        return x
    torch.distributed.all_reduce(x, group=_TP_GROUP)
    return x
