"""Admission of waiting requests under KV-cache pressure with prefix caching: a request that
cannot be admitted must not keep the cached blocks its prefix matched (nor a recurrent-state
slot), or the blocks it hoards can make the pool look too small for a request that fits alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mtpserve.engine.block_manager import BlockManager
from mtpserve.engine.scheduler import Scheduler
from mtpserve.engine.sequence import Sequence
from mtpserve.sampling_params import SamplingParams

BS = 4


def _seq(rid: str, tokens: list[int]) -> Sequence:
    no_stop_strings = SimpleNamespace(has_stops=False, append=lambda token_id: None)
    return Sequence(rid, tokens, SamplingParams(max_tokens=100, ignore_eos=True), (), 10**6,
                    no_stop_strings, None)


def _step(sched: Scheduler, bm: BlockManager, next_token: int = 7) -> list[str]:
    """One engine step without a model: every scheduled sequence computes its tokens; one
    that reaches its end gets ``next_token``. Returns the scheduled request ids."""
    out = sched.schedule()
    for s in out.scheduled:
        s.seq.num_computed_tokens += s.num_new_tokens
        bm.register_full_blocks(s.seq)
        if s.seq.num_computed_tokens == s.seq.num_tokens:
            s.seq.append_token(next_token)
    return [s.seq.request_id for s in out.scheduled]


def test_request_refused_admission_holds_no_blocks():
    """Request X leaves 3 cached blocks; A runs in 5 of 8 blocks; B matches X's 3 blocks but
    needs 6, so it waits. B must let go of X's blocks while it waits: then A grows into them
    (they are free, cached) instead of being preempted, and never meets a pool that looks too
    small (the old behaviour: A preempted, then "KV cache too small ... 0 free of 8" with
    nothing running, B holding 3 blocks)."""
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    x_tokens = list(range(1, 13))                      # 3 full blocks
    x = _seq("x", x_tokens + [99])
    sched.add(x)
    assert _step(sched, bm) == ["x"]
    sched.remove(x)                                   # finished: its blocks stay cached
    a = _seq("a", list(range(100, 119)))              # 19 tokens: 5 blocks
    sched.add(a)
    assert _step(sched, bm) == ["a"]
    b = _seq("b", x_tokens + list(range(200, 212)))   # 24 tokens: 3 cached + 3 new blocks
    sched.add(b)
    assert _step(sched, bm) == ["a"]                  # B does not fit beside A
    assert b.block_table == [] and b.num_computed_tokens == 0
    assert bm.num_free_blocks == 3
    for _ in range(8):                                # A grows past 5 blocks
        assert _step(sched, bm)[:1] == ["a"]
    assert sched.num_preemptions == 0
    assert len(a.block_table) == 7 and a.status.name == "RUNNING"


def test_waiting_request_keeps_no_state_slot():
    """The same with a recurrent-state pool of one slot (hybrid models): a request refused for
    lack of blocks gives its slot back."""
    class Slots:
        def __init__(self):
            self.free_slots = [0]

        def alloc(self):
            return self.free_slots.pop() if self.free_slots else None

        def free(self, slot):
            self.free_slots.append(slot)

    bm = BlockManager(4, BS, enable_prefix_caching=True)
    slots = Slots()
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, state_cache=slots)
    big = _seq("big", list(range(1, 30)))             # 8 blocks: never fits
    sched.add(big)
    with pytest.raises(RuntimeError, match="KV cache too small: request big needs 8 more "
                                           "blocks, 4 free of 4"):
        sched.schedule()
    assert big.state_slot is None and slots.free_slots == [0] and big.block_table == []
