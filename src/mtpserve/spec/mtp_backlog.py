"""Plain steps the MTP has not observed yet (async scheduling, engine/overlap.py).

When nothing drafts, the MTP need not observe each step as it runs: its cache only has to hold
every position's pair (target hidden state, next token) by the time a sequence drafts again. So
an overlapped plain step only keeps a copy of its hidden states and the ids after them on the
device (:meth:`ObserveBacklog.add`, one small copy; the MTP shadows take their KV blocks at
once, as the synchronous observe would, so the pool runs short where it would), and the MTP
observes the whole backlog in one forward later (spec/mtp.py ``catch_up``): before the next
drafting step, or when the backlog reaches its limit. An MTP step costs about what one target
layer does, so observing every plain step would keep an MTP engine whose drafts do not pay about
one layer in num_layers + 1 slower than plain decoding; one forward over many positions costs
little more than one over one (H200, batch 1: 0.4-0.8 ms for 3-15 positions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mtpserve.engine.scheduler import SchedulerOutput
from mtpserve.engine.sequence import Sequence
from mtpserve.kernels.paged_attention import SMALL_QUERY


@dataclass
class Run:
    """One sequence's positions ``start .. start + len(rows) - 1``, kept in the backlog at
    ``rows`` (indices into the hidden states and ids :meth:`ObserveBacklog.take` returns)."""

    seq: Sequence
    start: int
    rows: list[int] = field(default_factory=list)


class ObserveBacklog:
    """Launched plain steps not observed by the MTP yet.

    Args:
        max_tokens: positions held before the proposer must catch up (a prefill chunk alone
            may reach it); max_steps: steps held before it must. Default ``SMALL_QUERY`` (16):
            decode steps then leave each sequence a run of at most 16 positions, which the
            catch-up attends with the per-token Triton kernel and, within the graph token
            limit, replays from a captured MTP graph; a longer run (a prefill chunk in the
            backlog) takes the eager SDPA path. On the H200 (hybrid MoE, batch 1,
            benchmarks/gpu_mtp_catchup.py) a catch-up of 7-15 positions took 0.55-0.8 ms, one of
            31-191 positions 3-6 ms: with 64 steps the drafting step after a run of plain steps
            cost 9-12 ms, and measured so, drafting never looked worth it.
    """

    def __init__(self, max_tokens: int, max_steps: int = SMALL_QUERY):
        self.max_tokens, self.max_steps = max_tokens, max_steps
        self._steps: list[tuple[list[tuple[Sequence, int, int]], torch.Tensor, torch.Tensor]] = []
        self.num_tokens = 0

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def full(self) -> bool:
        return self.num_tokens >= self.max_tokens or len(self._steps) >= self.max_steps

    def add(self, sched: SchedulerOutput, hidden: torch.Tensor, next_ids: torch.Tensor) -> None:
        """Keep a launched plain step: ``sched`` (its sequences' ``num_computed_tokens``
        already past it), ``hidden`` [T, H] per batch token (copied: a graph's output buffer is
        rewritten by the next replay) and ``next_ids`` [T] int64 (kept as is)."""
        items = [(s.seq, s.seq.num_computed_tokens - s.num_new_tokens, s.num_new_tokens)
                 for s in sched.scheduled]
        self._steps.append((items, hidden.clone(), next_ids))
        self.num_tokens += hidden.shape[0]

    def take(self) -> tuple[list[Run], torch.Tensor | None, torch.Tensor | None]:
        """Empty the backlog: per sequence still running, its latest run of consecutive
        positions (a sequence preempted and recomputed starts a new run, which replaces the
        old), and all steps' hidden states [O, H] and next ids [O] back to back (None when
        empty)."""
        steps, self._steps, self.num_tokens = self._steps, [], 0
        runs: dict[str, Run] = {}
        row = 0
        for items, _, _ in steps:
            for seq, start, n in items:
                r = runs.get(seq.request_id)
                if r is None or r.start + len(r.rows) != start:
                    r = runs[seq.request_id] = Run(seq, start)
                r.rows.extend(range(row, row + n))
                row += n
        if not steps:
            return [], None, None
        hidden = _cat([h for _, h, _ in steps])
        ids = _cat([i for _, _, i in steps])
        return [r for r in runs.values() if not r.seq.is_finished], hidden, ids


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)
