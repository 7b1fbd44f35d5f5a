"""Greedy MTP drafts that stay on the device until the verify step reads its own results back.

The draft chain (mtp_chain.py) ends with the drafts [B, m] int64 on the device. Reading them
back at once would make the host wait for the chain, and the GPU then waits while the host
schedules and prepares the verify step. Instead each drafted sequence gets placeholder ids of
the right count (the scheduler and ``ModelRunner.prepare`` need only the count), the verify
batch's input ids are patched on the device from the chain's output (:meth:`PendingDrafts.patch`,
as ``overlap.patch_input_ids`` does for async plain steps), and the host copies are filled in
after the verify forward is launched (:meth:`PendingDrafts.resolve`), before anything reads
them: the chain runs while the host schedules and prepares.
"""

from __future__ import annotations

import torch

from mtpserve.engine.forward_batch import ForwardBatch, HostCopy, to_device
from mtpserve.engine.scheduler import SchedulerOutput
from mtpserve.engine.sequence import Sequence


class PendingDrafts:
    """The chain's drafts of one step, not yet on the host.

    Args:
        drafts: [B, m] int64 on the device (row i: sequence ``seqs[i]``'s drafts; a view of a
            chain graph's static output stays valid until a chain graph replays again, in the
            next step's ``draft``).
        seqs: the B drafted sequences; each one's ``draft_token_ids`` is set here to
            ``budgets[i]`` placeholder zeros.
    """

    def __init__(self, drafts: torch.Tensor, seqs: list[Sequence], budgets: list[int]):
        self.drafts = drafts
        self.rows = {seq.request_id: i for i, seq in enumerate(seqs)}
        for seq, budget in zip(seqs, budgets):
            seq.draft_token_ids = [0] * budget
        # on CUDA the host copy starts now, right behind the chain, and :meth:`resolve` waits
        # for it alone, not for the verify forward queued later
        self._copy = HostCopy(drafts)

    def patch(self, batch: ForwardBatch, sched: SchedulerOutput) -> None:
        """Write the drafts of the scheduled sequences into ``batch.input_ids`` on the device
        (``prepare`` laid out each sequence's new tokens, then its scheduled drafts, which the
        scheduler may have cut to a prefix). One host-to-device copy of the indices."""
        m = self.drafts.shape[1]
        if self._in_order(sched, m):   # row i = the i-th sequence, 1 + m tokens each: one copy
            B = len(sched.scheduled)
            batch.input_ids.view(B, 1 + m)[:, 1:].copy_(self.drafts[:B])
            return
        dst, src, offset = [], [], 0
        for s in sched.scheduled:
            row = self.rows.get(s.seq.request_id)
            if row is not None:
                first = offset + s.num_new_tokens
                dst.extend(range(first, first + len(s.draft_token_ids)))
                src.extend(range(row * m, row * m + len(s.draft_token_ids)))
            offset += s.num_query_tokens
        if dst:
            idx = to_device(dst + src, torch.int64, batch.input_ids.device)
            values = self.drafts.reshape(-1).index_select(0, idx[len(dst):])
            batch.input_ids.index_copy_(0, idx[:len(dst)], values)

    def _in_order(self, sched: SchedulerOutput, m: int) -> bool:
        """Whether the step is exactly the drafted sequences in row order, each its newest
        token and all ``m`` drafts (its batch rows ``i (1 + m) ..`` hold them back to back)."""
        return all(self.rows.get(s.seq.request_id) == i and s.num_new_tokens == 1
                   and len(s.draft_token_ids) == m for i, s in enumerate(sched.scheduled))

    def resolve(self, sched: SchedulerOutput) -> None:
        """Replace the placeholders of the drafted sequences scheduled this step, and of their
        scheduled drafts, with the real ids (from the copy started at construction: waits for
        the chain, not for the verify forward). Drafted sequences the step left out keep their
        placeholders; nothing reads them before the next ``propose`` clears them."""
        values = self._copy.tolist()
        for s in sched.scheduled:
            row = self.rows.get(s.seq.request_id)
            if row is not None:
                s.draft_token_ids[:] = values[row][:len(s.draft_token_ids)]
                s.seq.draft_token_ids[:] = values[row][:len(s.seq.draft_token_ids)]
