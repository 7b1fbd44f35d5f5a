"""Paged KV-cache bookkeeping: free list, reference counts and a prefix cache of full blocks.

Blocks hold ``block_size`` tokens. A block that is full and whose tokens all have computed K/V is
registered under a hash of (parent block's hash, its token ids), so a later request with the same
prefix reuses it instead of recomputing (automatic prefix caching, as in vLLM / SGLang). Freed
blocks keep their hash until they are handed out again, least recently freed first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from mtpserve.engine.sequence import Sequence


def block_hash(parent: bytes | None, token_ids: list[int]) -> bytes:
    """SHA-256 of the parent hash and the block's token ids (collision-safe chaining)."""
    h = hashlib.sha256(parent or b"root")
    h.update(b"".join(t.to_bytes(4, "little", signed=False) for t in token_ids))
    return h.digest()


class BlockManager:
    """Allocates KV blocks to sequences.

    Args:
        num_blocks: blocks in the pool; block_size: tokens per block.
        enable_prefix_caching: reuse full blocks across requests with equal prefixes.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    # ---- queries ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        """Fraction of blocks held by running sequences (0..1)."""
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks ``seq`` needs to hold ``num_tokens`` tokens in total."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    # ---- prefix cache ------------------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> int:
        """Attach cached blocks for the longest cached prefix of ``seq``; return tokens reused.

        At most ``num_tokens - 1`` tokens are reused: the last token must be computed to give
        logits. Only for a sequence that holds no blocks yet.
        """
        if not self.prefix_caching or seq.block_table:
            return 0
        bs, parent, blocks = self.block_size, None, []
        hashes = []
        for i in range((seq.num_tokens - 1) // bs):
            h = block_hash(parent, seq.token_ids[i * bs:(i + 1) * bs])
            b = self.cached.get(h)
            if b is None:
                break
            blocks.append(b)
            hashes.append(h)
            parent = h
        for b in blocks:
            self._take(b)
        seq.block_table = blocks
        seq.block_hashes = hashes
        return len(blocks) * bs

    def register_full_blocks(self, seq: Sequence) -> None:
        """Hash and publish every block of ``seq`` that is full of computed tokens whose ids are
        known (async scheduling: not a placeholder still being sampled)."""
        if not self.prefix_caching:
            return
        bs = self.block_size
        known = min(seq.num_computed_tokens, seq.num_tokens - seq.num_pending)
        # (a sequence retired by the scheduler has given its blocks back: nothing to publish)
        for i in range(len(seq.block_hashes), min(known // bs, len(seq.block_table))):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            h = block_hash(parent, seq.token_ids[i * bs:(i + 1) * bs])
            seq.block_hashes.append(h)
            b = seq.block_table[i]
            if h not in self.cached and self.hash_of[b] is None:
                self.cached[h] = b
                self.hash_of[b] = h

    # ---- allocation --------------------------------------------------------------------------
    def can_allocate(self, n: int) -> bool:
        return n <= len(self.free)

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow ``seq``'s block table to hold ``num_tokens`` tokens; False (nothing taken) if the
        pool has too few free blocks."""
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self.free):
            return False
        for _ in range(need):
            b, _ = self.free.popitem(last=False)
            self._evict(b)
            self.ref_count[b] = 1
            seq.block_table.append(b)
        return True

    def free_seq(self, seq: Sequence) -> None:
        """Release all of ``seq``'s blocks (hashed blocks stay reusable until evicted)."""
        for b in reversed(seq.block_table):
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.free[b] = None
                if self.hash_of[b] is None:  # nothing to keep: hand it out first
                    self.free.move_to_end(b, last=False)
        seq.block_table = []
        seq.block_hashes = []

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Return blocks beyond what ``num_tokens`` tokens need (after rejected drafts)."""
        keep = -(-num_tokens // self.block_size)
        while len(seq.block_table) > keep:
            b = seq.block_table.pop()
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.free[b] = None
                self.free.move_to_end(b, last=False)

    def _take(self, b: int) -> None:
        if self.ref_count[b] == 0:
            del self.free[b]
        self.ref_count[b] += 1

    def _evict(self, b: int) -> None:
        h = self.hash_of[b]
        if h is not None:
            self.hash_of[b] = None
            if self.cached.get(h) == b:
                del self.cached[h]
