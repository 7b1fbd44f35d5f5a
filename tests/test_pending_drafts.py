"""spec/pending_drafts.py: greedy MTP drafts kept on the device until verification: placeholders
of the right count on the host, the verify batch's input ids patched from the chain's output
(also when the scheduler cut a sequence's drafts to a prefix), then the host lists filled in."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from mtpserve.engine.sequence import Sequence
from mtpserve.sampling_params import SamplingParams
from mtpserve.spec.pending_drafts import PendingDrafts


def seq(rid: str, n: int, computed: int) -> Sequence:
    s = Sequence(rid, list(range(100, 100 + n)), SamplingParams(), (), 64, None, None)
    s.num_computed_tokens = computed
    return s


def test_placeholders_then_patched_inputs_then_real_ids():
    a, b, c = seq("a", 5, 4), seq("b", 3, 2), seq("c", 4, 0)
    drafts = torch.tensor([[11, 12, 13], [21, 22, 23]])
    pending = PendingDrafts(drafts, [a, b], [3, 2])
    assert a.draft_token_ids == [0, 0, 0] and b.draft_token_ids == [0, 0]
    # c prefills 4 tokens; b keeps 1 of its 2 drafts (cut by the token budget); a keeps 3
    sched = SchedulerOutput([ScheduledSeq(c, 4, []), ScheduledSeq(b, 1, b.draft_token_ids[:1]),
                             ScheduledSeq(a, 1, a.draft_token_ids[:])])
    ids = [100, 101, 102, 103, 102, 0, 104, 0, 0, 0]   # prepare's layout, placeholders as 0
    batch = SimpleNamespace(input_ids=torch.tensor(ids))
    pending.patch(batch, sched)
    assert batch.input_ids.tolist() == [100, 101, 102, 103, 102, 21, 104, 11, 12, 13]
    pending.resolve(sched)
    assert [s.draft_token_ids for s in sched.scheduled] == [[], [21], [11, 12, 13]]
    assert a.draft_token_ids == [11, 12, 13] and b.draft_token_ids == [21, 22]


def test_a_drafted_sequence_left_out_of_the_step_is_not_patched():
    a, b = seq("a", 5, 4), seq("b", 3, 2)
    pending = PendingDrafts(torch.tensor([[7, 8], [9, 10]]), [a, b], [2, 2])
    b.draft_token_ids = []                      # preempted: the scheduler drops its drafts
    sched = SchedulerOutput([ScheduledSeq(a, 1, a.draft_token_ids[:])])
    batch = SimpleNamespace(input_ids=torch.tensor([104, 0, 0]))
    pending.patch(batch, sched)
    pending.resolve(sched)
    assert batch.input_ids.tolist() == [104, 7, 8]
    assert a.draft_token_ids == [7, 8] and b.draft_token_ids == []


def test_sequences_in_row_order_with_every_draft_are_patched_in_one_copy():
    a, b = seq("a", 5, 4), seq("b", 3, 2)
    pending = PendingDrafts(torch.tensor([[7, 8], [9, 10], [5, 6]]), [a, b], [2, 2])
    sched = SchedulerOutput([ScheduledSeq(a, 1, a.draft_token_ids[:]),
                             ScheduledSeq(b, 1, b.draft_token_ids[:])])
    assert pending._in_order(sched, 2)
    batch = SimpleNamespace(input_ids=torch.tensor([104, 0, 0, 102, 0, 0]))
    pending.patch(batch, sched)
    assert batch.input_ids.tolist() == [104, 7, 8, 102, 9, 10]
    # the same sequences in the other order take the general path, to the same effect
    swapped = SchedulerOutput(sched.scheduled[::-1])
    assert not pending._in_order(swapped, 2)
    batch = SimpleNamespace(input_ids=torch.tensor([102, 0, 0, 104, 0, 0]))
    pending.patch(batch, swapped)
    assert batch.input_ids.tolist() == [102, 9, 10, 104, 7, 8]
