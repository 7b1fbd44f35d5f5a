"""A step's flat batch layout (engine/batch_layout.py): the numpy layout gives exactly the
values of the list layout, and both the values a hand-made schedule must give."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mtpserve.engine.batch_layout import (ARRAY_MIN_TOKENS, batch_layout, layout_arrays,
                                          layout_lists)
from mtpserve.engine.scheduler import ScheduledSeq
from mtpserve.engine.sequence import Sequence
from mtpserve.sampling_params import SamplingParams

BS = 4


def _scheduled(tokens, computed, new, drafts, table) -> ScheduledSeq:
    seq = Sequence("r", tokens, SamplingParams(), (), 10**6, None, None)
    seq.num_computed_tokens, seq.block_table = computed, table
    return ScheduledSeq(seq, new, drafts)


def _plain(layout):
    """The layout with its arrays as lists (int64 values, int32 values, the rest)."""
    return ([int(x) for x in layout.i64], [int(x) for x in layout.i32], layout.qlens,
            layout.slens, layout.rows, layout.tables, layout.width, layout.num_logits)


def test_a_hand_made_schedule():
    """A prefill chunk that does not reach the end (no logits), a verify of 2 drafts, a decode."""
    chunk = _scheduled([11, 12, 13, 14, 15, 16], 0, 3, [], [7, 2])
    verify = _scheduled([21, 22, 23, 24, 25], 4, 1, [90, 91], [5, 6])
    decode = _scheduled([31, 32], 1, 1, [], [3])
    want = ([11, 12, 13, 25, 90, 91, 32,          # ids
             0, 1, 2, 4, 5, 6, 1,                 # positions
             28, 29, 30, 24, 25, 26, 13,          # slots: block 7 -> 28.., 6 -> 24.., 3 -> 12..
             3, 3, 1, 3, 7, 2,                    # query lengths, sequence lengths after
             3, 4, 5, 6],                         # logits rows: the verify's 3, the decode's
            [0, 3, 6, 7, 0, 0, 0, 1, 1, 1, 2,     # query starts, each token's sequence
             1, 2, 3, 5, 6, 7, 2,                 # key counts
             7, 2, 5, 6, 3, 0],                   # tables, padded to 2 blocks
            [3, 3, 1], [3, 7, 2], [(0, 0), (0, 3), (3, 1)], [7, 2, 5, 6, 3, 0], 2, 4)
    batch = [chunk, verify, decode]
    assert _plain(layout_lists(batch, BS)) == want
    assert _plain(layout_arrays(batch, BS)) == want


@pytest.mark.parametrize("seed", range(6))
def test_the_numpy_layout_equals_the_list_layout(seed):
    rng = random.Random(seed)
    batch = []
    for _ in range(rng.randint(1, 70)):
        length = rng.randint(2, 300)
        tokens = [rng.randrange(50000) for _ in range(length)]
        if rng.random() < 0.2:   # a prefill chunk, which may or may not reach the end
            computed = rng.randrange(length)
            new, drafts = rng.randint(1, length - computed), []
        else:                    # a decode, with up to 5 drafts
            computed, new = length - 1, 1
            drafts = [rng.randrange(50000) for _ in range(rng.randint(0, 5))]
        blocks = -(-(computed + new + len(drafts)) // BS) + rng.randint(0, 2)
        batch.append(_scheduled(tokens, computed, new, drafts,
                                rng.sample(range(10000), blocks)))
    got = layout_arrays(batch, BS)
    assert isinstance(got.i64, np.ndarray) and got.i64.dtype == np.int64
    assert got.i32.dtype == np.int32
    assert _plain(got) == _plain(layout_lists(batch, BS))


def test_the_size_picks_the_layout():
    one = _scheduled(list(range(10)), 9, 1, [1, 2, 3], [0, 1, 2, 3])
    assert isinstance(batch_layout([one], BS).i64, list)
    many = [one] * -(-ARRAY_MIN_TOKENS // 4)
    assert isinstance(batch_layout(many, BS).i64, np.ndarray)


def test_a_position_past_the_block_table_raises_in_both_layouts():
    """A token whose block the sequence does not hold is an error, not a write into another
    table's padding (block 0)."""
    short = _scheduled(list(range(10)), 9, 1, [1, 2, 3], [4, 5])    # positions 9-12: 4 blocks
    wide = _scheduled(list(range(20)), 19, 1, [], [6, 7, 8, 9, 10])
    for layout in (layout_lists, layout_arrays):
        with pytest.raises(IndexError):
            layout([short, wide], BS)
