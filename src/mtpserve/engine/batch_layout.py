"""The host side of a step's flat (varlen) batch: every per-token and per-sequence integer the
forward reads, laid out in the two arrays ``ModelRunner.prepare`` uploads.

A small batch is laid out with Python lists (a few microseconds a sequence); a large one with
numpy over per-sequence arrays: on the development CPU (session 38, BENCHMARKS.md), layout and
int64 tensor together, 64 sequences of 5 tokens took 126 us against the lists' 284, one
sequence 22 against 8; they cross near 30 tokens. A drafting step's layout sits between its
read-back and the next launch, where the device waits. Both give the same values.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from mtpserve.engine.scheduler import ScheduledSeq

# Batches of at least this many tokens are laid out with numpy (below it, numpy's per-call
# overhead costs more than the lists: module doc).
ARRAY_MIN_TOKENS = 32


@dataclass
class BatchLayout:
    """One step's integers, T tokens of B sequences.

    ``i64`` (int64 values, list or ndarray): input ids [T], positions [T], KV slots [T], query
    lengths [B], sequence lengths after the step [B], logits rows [N] (flat token indices),
    back to back. ``i32`` (int32 values): query start offsets [B + 1], each token's sequence
    [T], each token's key count (position + 1) [T], block tables [B * width] padded with 0.
    ``qlens``, ``slens``: query and sequence lengths (host lists); ``rows``: per sequence,
    (first logits row, count); ``tables``: the padded block tables as a flat host list;
    ``width``: blocks per table row; ``num_logits``: N.
    """

    i64: list[int] | np.ndarray
    i32: list[int] | np.ndarray
    qlens: list[int]
    slens: list[int]
    rows: list[tuple[int, int]]
    tables: list[int]
    width: int
    num_logits: int

    @property
    def num_tokens(self) -> int:
        return sum(self.qlens)


def batch_layout(scheduled: list[ScheduledSeq], block_size: int) -> BatchLayout:
    """The layout of ``scheduled`` (each sequence's ``num_new_tokens`` from
    ``num_computed_tokens`` on, then its drafts; logits for the last ``1 + drafts`` tokens of a
    sequence that samples), with lists or numpy by size (module doc)."""
    num_tokens = sum(s.num_query_tokens for s in scheduled)
    if num_tokens >= ARRAY_MIN_TOKENS:
        return layout_arrays(scheduled, block_size)
    return layout_lists(scheduled, block_size)


def _tokens(s: ScheduledSeq) -> list[int]:
    start = s.seq.num_computed_tokens
    return s.seq.token_ids[start:start + s.num_new_tokens] + s.draft_token_ids


def _num_logits(s: ScheduledSeq) -> int:
    return 1 + len(s.draft_token_ids) if s.samples else 0


def _padded_tables(scheduled: list[ScheduledSeq]) -> tuple[list[int], int]:
    width = max(len(s.seq.block_table) for s in scheduled)
    return [x for s in scheduled
            for x in s.seq.block_table + [0] * (width - len(s.seq.block_table))], width


def layout_lists(scheduled: list[ScheduledSeq], block_size: int) -> BatchLayout:
    """:func:`batch_layout` with Python lists, a token at a time."""
    ids, pos, slots, rows_of, qlens, slens, logits_idx, rows = [], [], [], [], [], [], [], []
    bs = block_size
    for b, s in enumerate(scheduled):
        start, toks, table = s.seq.num_computed_tokens, _tokens(s), s.seq.block_table
        base = len(ids)
        ids.extend(toks)
        p = range(start, start + len(toks))
        pos.extend(p)
        slots.extend(table[x // bs] * bs + x % bs for x in p)
        rows_of.extend([b] * len(toks))
        qlens.append(len(toks))
        slens.append(start + len(toks))
        n_logits = _num_logits(s)
        rows.append((len(logits_idx), n_logits))
        logits_idx.extend(range(base + len(toks) - n_logits, base + len(toks)))
    tables, width = _padded_tables(scheduled)
    starts, acc = [0], 0
    for q in qlens:
        acc += q
        starts.append(acc)
    return BatchLayout(ids + pos + slots + qlens + slens + logits_idx,
                       starts + rows_of + [x + 1 for x in pos] + tables,
                       qlens, slens, rows, tables, width, len(logits_idx))


def layout_arrays(scheduled: list[ScheduledSeq], block_size: int) -> BatchLayout:
    """:func:`batch_layout` with numpy: one pass over the sequences for their scalars and
    tokens, the per-token values as whole-array operations.

    Raises:
        IndexError: a token's position lies past its sequence's block table (as the lists'
            indexing does; a scheduler bug, never a request's).
    """
    toks = [_tokens(s) for s in scheduled]
    qlens = [len(t) for t in toks]
    B, T = len(scheduled), sum(qlens)
    q = np.array(qlens, np.int64)
    first = np.array([s.seq.num_computed_tokens for s in scheduled], np.int64)
    cu = np.zeros(B + 1, np.int64)
    np.cumsum(q, out=cu[1:])
    rows_of = np.repeat(np.arange(B, dtype=np.int64), q)
    pos = np.arange(T, dtype=np.int64) + np.repeat(first - cu[:-1], q)
    tables, width = _padded_tables(scheduled)
    table = np.array(tables, np.int64).reshape(B, width)
    block = pos // block_size
    held = np.array([len(s.seq.block_table) for s in scheduled], np.int64)
    if (block >= held[rows_of]).any():   # (the lists' index raises; the padding would not)
        b = int(rows_of[np.argmax(block >= held[rows_of])])
        raise IndexError(f"request {scheduled[b].seq.request_id}: a position past its "
                         f"{int(held[b])} KV blocks")
    slots = table[rows_of, block] * block_size + pos % block_size
    n = np.array([_num_logits(s) for s in scheduled], np.int64)
    ncu = np.zeros(B + 1, np.int64)
    np.cumsum(n, out=ncu[1:])
    N = int(ncu[-1])
    logits_idx = np.arange(N, dtype=np.int64) + np.repeat(cu[1:] - n - ncu[:-1], n)
    ids = np.fromiter(chain.from_iterable(toks), np.int64, T)
    slens = first + q
    i64 = np.concatenate([ids, pos, slots, q, slens, logits_idx])
    i32 = np.concatenate([cu, rows_of, pos + 1, table.ravel()]).astype(np.int32)
    rows = list(zip(ncu[:-1].tolist(), n.tolist()))
    return BatchLayout(i64, i32, qlens, slens.tolist(), rows, tables, width, N)
