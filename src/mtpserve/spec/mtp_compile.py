"""The layouts of the dry observe forwards that compile the MTP's catch-up kernels ahead.

Under async scheduling the MTP observes a backlog of plain steps in one forward
(mtp_backlog.py): any number of sequences, each with a run of positions. Which kernels and which
Triton specializations that forward needs depends on the token count (its power-of-two bucket,
and whether it is 1 or a multiple of 16: ``compile_ahead.token_buckets``) and on the layout. Runs
of at most ``SMALL_QUERY`` positions per sequence take the per-token Triton attention (decode
steps: up to 16 per sequence), a longer run the eager SDPA path (a prefill chunk in the
backlog). So each bucket is compiled in up to three layouts: packed into as few sequences as
possible, spread in runs of at most ``SMALL_QUERY``, and split over two sequences.
"""

from __future__ import annotations

from mtpserve.kernels.compile_ahead import token_buckets
from mtpserve.kernels.paged_attention import SMALL_QUERY


def observe_layouts(max_tokens: int, per_seq: int, max_seqs: int) -> list[list[int]]:
    """Per token bucket n <= ``max_tokens``, the positions per sequence of each dry forward
    (packed in runs of ``per_seq``, spread in runs of ``SMALL_QUERY``, split over two), leaving
    out layouts that need more than ``max_seqs`` sequences and repeats. Empty when a sequence
    cannot hold a position (``per_seq`` or ``max_seqs`` < 1)."""
    if per_seq < 1 or max_seqs < 1:
        return []
    layouts: list[list[int]] = []
    for n in token_buckets(max_tokens):
        half = [n // 2, n - n // 2] if n > 1 else []
        for parts in (_runs(n, per_seq), _runs(n, min(SMALL_QUERY, per_seq)), half):
            if parts and len(parts) <= max_seqs and max(parts) <= per_seq \
                    and parts not in layouts:
                layouts.append(parts)
    return layouts


def _runs(n: int, size: int) -> list[int]:
    """``n`` positions in runs of ``size``, the rest last."""
    return [size] * (n // size) + ([n % size] if n % size else [])
