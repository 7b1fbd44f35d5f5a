"""Tensor-parallel process-group state (TP=1 until the multi-GPU work lands)."""

from mtpserve.distributed.parallel_state import get_tp_rank, get_tp_size, tp_all_reduce

__all__ = ["get_tp_rank", "get_tp_size", "tp_all_reduce"]
