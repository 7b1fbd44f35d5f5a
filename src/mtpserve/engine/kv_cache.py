"""The paged KV-cache tensors of one model (the block bookkeeping is in block_manager.py)."""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


class KVCache:
    """K and V tensors for every attention layer, in fixed-size blocks.

    ``layers[i]`` is layer i's (K, V), each [num_blocks * block_size, num_kv_heads, head_dim] in
    ``dtype`` on ``device``. Zero-filled: padded attention rows read slot 0, and 0 * NaN from
    uninitialised memory would poison them.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device):
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim)
        self.tensor = torch.zeros(shape, dtype=dtype, device=device)
        self.layers = [(self.tensor[i, 0], self.tensor[i, 1]) for i in range(num_layers)]
        logger.info("KV cache: %d blocks x %d tokens, %d layers (%.1f MiB)", num_blocks,
                    block_size, num_layers, self.nbytes / 2**20)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        """Bytes one block takes over all layers (K and V)."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * (torch.finfo(dtype).bits // 8)
