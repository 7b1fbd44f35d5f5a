"""Continuous batching with a per-step token budget, chunked prefill and preemption.

Each step, running sequences go first (a decode token each, plus their draft tokens under
speculation, or the next chunk of an unfinished prefill), then waiting sequences are admitted
while the token budget, ``max_num_seqs`` and free KV blocks allow. When a running sequence cannot
get a block, the most recently arrived running sequence is preempted: its blocks are freed and it
goes back to the front of the queue to be recomputed later (its output so far is kept, so it is
never dropped or duplicated). This is vLLM's recompute preemption (Kwon et al. 2023, sec. 4.5).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mtpserve.engine.block_manager import BlockManager
from mtpserve.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    """``num_new_tokens`` of ``seq.token_ids`` from ``num_computed_tokens`` on, then its drafts.

    ``samples`` is True when this step reaches the sequence's newest token, so the forward pass
    must produce logits for it (and for each draft). It is fixed when the step is scheduled.
    """

    seq: Sequence
    num_new_tokens: int
    draft_token_ids: list[int]
    samples: bool = field(init=False)

    def __post_init__(self) -> None:
        self.samples = self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens

    @property
    def num_query_tokens(self) -> int:
        return self.num_new_tokens + len(self.draft_token_ids)


@dataclass
class SchedulerOutput:
    """``scheduled`` this step; ``preempted`` (back to waiting, recomputed later); ``retired``:
    sequences whose pending tokens end them by length, taken out (Scheduler ``_retire``)."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    retired: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_query_tokens for s in self.scheduled)


class Scheduler:
    """Decides which sequences run each step and how many tokens each computes.

    Args:
        block_manager: the KV pool; max_num_seqs: most sequences per step;
        max_num_batched_tokens: token budget per step (prefills are chunked to fit it);
        state_cache: the recurrent-state pool of a hybrid model (a slot per running sequence,
            taken on admission, returned on preemption or finish).
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int,
                 max_num_batched_tokens: int, state_cache=None):
        self.bm = block_manager
        self.state_cache = state_cache  # hybrid models: a recurrent-state slot per running request
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        self.bm.free_seq(seq)
        if seq.state_slot is not None:
            self.state_cache.free(seq.state_slot)
            seq.state_slot = None

    def _refuse(self, seq: Sequence) -> None:
        """A request left waiting holds nothing: the cached blocks its prefix matched stay free
        for running requests to grow into (it matches them again next time), and its state slot
        goes back."""
        self._release(seq)
        seq.num_computed_tokens = 0

    # ---- scheduling --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.budget)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.num_pending and seq.finishes_by_length:   # async scheduling: ends as is
                self._retire(seq)
                out.retired.append(seq)
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            reaches_end = seq.num_computed_tokens + n == seq.num_tokens
            drafts = seq.draft_token_ids[: budget - n] if reaches_end else []
            if not self._allocate_or_preempt(seq, seq.num_computed_tokens + n + len(drafts), out):
                break  # seq itself was preempted: nothing after it is left to schedule
            out.scheduled.append(ScheduledSeq(seq, n, drafts))
            budget -= n + len(drafts)
            i += 1
        return budget

    def _retire(self, seq: Sequence) -> None:
        """Async scheduling: ``seq``'s tokens still on the device reach max_tokens or
        max_model_len, so it needs no further step. It leaves ``running`` and gives back its
        blocks and state slot now, as the synchronous engine's would have been given back after
        that step, so a waiting request is admitted in this very step (the device finishes the
        step that writes them before any later one reuses them). The engine drops it when the
        tokens are read back."""
        self.running.remove(seq)
        self._release(seq)

    def _allocate_or_preempt(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool:
        while not self.bm.allocate(seq, num_tokens):
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.draft_token_ids = []
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        out.scheduled = [s for s in out.scheduled if s.seq is not seq]
        self.num_preemptions += 1

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not seq.block_table:
                seq.num_computed_tokens = self.bm.match_prefix(seq)
                if not seq.output_token_ids:  # a resumed (preempted) request keeps its first count
                    seq.num_cached_tokens = seq.num_computed_tokens
            if self.state_cache is not None and seq.state_slot is None:
                seq.state_slot = self.state_cache.alloc()
                if seq.state_slot is None:
                    self._refuse(seq)
                    break
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self.bm.allocate(seq, seq.num_computed_tokens + n):
                needed = self.bm.blocks_needed(seq, seq.num_computed_tokens + n)
                free = self.bm.num_free_blocks   # both counted before the refusal releases
                self._refuse(seq)
                if not self.running:  # unreachable: the engine checks that one sequence fits
                    raise RuntimeError(
                        f"KV cache too small: request {seq.request_id} needs {needed} more "
                        f"blocks, {free} free of {self.bm.num_blocks}")
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n, []))
            budget -= n
