"""CUDA graphs of the greedy MTP draft chain (mtp_chain.py): one replay drafts a whole step.

Captured at start for every (rows P, steps m): P on the ladder of engine/cuda_graph.py up to
``max_num_seqs``, m in 1..k. Static inputs per graph: the MTP outputs ``hidden`` [P, H] and the
int64 / int32 buffers of a ChainPlan for (P, m); one block table [P_max, max_blocks] int32 is
shared by all graphs (a step copies its [B, W] tables into the top-left corner; entries past a
row's keys are never read, rows past B are never read: padding rows use table row 0). A step of
B rows and m drafts replays the smallest P >= B captured for m; the plan pads rows B..P-1 (K/V
to the pad slot, one key of table row 0), whose hidden rows keep whatever they held. Output:
the static drafts [P, m] int64, overwritten by the next replay of that graph.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from mtpserve.engine.cuda_graph import capture_graphs, graph_sizes
from mtpserve.engine.forward_batch import to_device, to_device_into
from mtpserve.engine.graph_inputs import WrittenInputs
from mtpserve.spec.mtp_chain import ChainInputs, ChainPlan, DraftChain, pick_variants

logger = logging.getLogger(__name__)


@dataclass
class _ChainGraph:
    steps: int
    graph: Any                    # torch.cuda.CUDAGraph (a stand-in in CPU tests)
    hidden: torch.Tensor          # [P, H] runner dtype, static input
    i64: torch.Tensor             # ChainPlan.i64 layout, static input
    i32: torch.Tensor             # ChainPlan.i32 layout, static input
    inputs: ChainInputs | None    # views of i64, i32 and the shared tables (None for m == 1)
    drafts: torch.Tensor | None = None   # [P, m] int64, static output
    # m > 1: up to k + 1 variants of i64 / i32 back to back, static inputs, and the variant each
    # row takes ([P] int64, padding rows 0): the graph gathers i64 / i32 from them first
    var64: torch.Tensor | None = None
    var32: torch.Tensor | None = None
    pick: torch.Tensor | None = None


class ChainGraphs:
    """Captured ``DraftChain.forward`` per (rows, steps).

    Args:
        chain: the DraftChain (its runner: device, dtype, pad slot); max_seqs: most rows;
        max_blocks: block-table width (``ceil(max_model_len / block_size)``); max_steps: k.
    """

    def __init__(self, chain: DraftChain, max_seqs: int, max_blocks: int, max_steps: int):
        self.chain, self.max_steps = chain, max_steps
        self.sizes = graph_sizes(max_seqs)
        r = chain.runner
        self.tables = torch.zeros(self.sizes[-1], max_blocks, dtype=torch.int32, device=r.device)
        self.graphs: dict[tuple[int, int], _ChainGraph] = {}
        self.written = WrittenInputs()   # the shared tables and each graph's row picks

    def keys(self) -> list[tuple[int, int]]:
        """(rows, steps) of every graph, smallest first."""
        return [(P, m) for P in self.sizes for m in range(1, self.max_steps + 1)]

    def padded(self, rows: int) -> int:
        return next(P for P in self.sizes if P >= rows)

    def fits(self, rows: int, steps: int) -> bool:
        """Whether a step of ``rows`` rows and ``steps`` drafts has a graph."""
        return bool(self.graphs) and rows <= self.sizes[-1] and 1 <= steps <= self.max_steps

    def static(self, key: tuple[int, int]) -> _ChainGraph:
        """The static inputs of ``key``'s graph: every row padding (pad slot, position 0)."""
        P, m = key
        r = self.chain.runner
        n64, n32 = ChainInputs.sizes(P, m)
        i64 = torch.zeros(n64, dtype=torch.int64, device=r.device)
        i64.view(3, m - 1, P)[1].fill_(r.pad_slot)
        i64.view(3, m - 1, P)[2].fill_(1)
        i32 = torch.zeros(n32, dtype=torch.int32, device=r.device)
        i32[P:].fill_(1)
        inputs = ChainInputs.view(i64, i32, self.tables[:P], P, m) if m > 1 else None
        hidden = torch.zeros(P, r.model_config.hidden_size, dtype=r.dtype, device=r.device)
        g = _ChainGraph(m, None, hidden, i64, i32, inputs)
        if m > 1:   # every variant starts as the padding layout
            V = self.max_steps + 1
            g.var64, g.var32 = i64.repeat(V), i32.repeat(V)
            g.pick = torch.zeros(P, dtype=torch.int64, device=r.device)
        return g

    def forward(self, g: _ChainGraph) -> torch.Tensor:
        """The captured work: row p's layout gathered from variant ``pick[p]``, then the
        chain."""
        if g.steps > 1:
            for out, var in ((g.i64, g.var64), (g.i32, g.var32)):
                pick_variants(var, self.max_steps + 1, g.pick, out=out)
        return self.chain.forward(g.hidden, g.inputs, g.steps)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every key, largest first, in one memory pool of their own."""
        t0 = time.perf_counter()
        for key, (graph, g, drafts) in capture_graphs(self.keys(), self.static,
                                                      self.forward).items():
            g.graph, g.drafts = graph, drafts
            self.graphs[key] = g
        logger.info("captured %d MTP draft-chain graphs (%d..%d rows, 1..%d steps) in %.1f s",
                    len(self.graphs), self.sizes[0], self.sizes[-1], self.max_steps,
                    time.perf_counter() - t0)

    def run(self, hidden: torch.Tensor, plan: ChainPlan) -> torch.Tensor:
        """Copy ``hidden`` [B, H] and ``plan`` (padded to a captured size) into the static
        inputs (as variant 0, every row picking it), replay; return the drafts [B,
        plan.steps] int64 (a view of the static output)."""
        return self.run_variants(hidden, [plan], None)

    def run_variants(self, hidden: torch.Tensor, plans: list[ChainPlan],
                     accepted: torch.Tensor | None) -> torch.Tensor:
        """Replay with row b laid out as ``plans[accepted[b]]`` (``DraftChain.run_variants``;
        every plan of the same rows, padded size, steps and table width; ``accepted`` [B]
        int64 on the device, or None: every row takes ``plans[0]``): the variants go into the
        graph's ``var64`` / ``var32`` in one upload each and the graph gathers each row's; the
        block tables (``plans[0]``'s) are written only when they changed. Returns the drafts
        [B, steps] int64 (a view of the static output)."""
        plan = plans[0]
        key, B = (plan.padded, plan.steps), plan.rows
        g = self.graphs[key]
        g.hidden[:B].copy_(hidden)
        if plan.steps > 1:
            n64, n32 = len(plan.i64), len(plan.i32)
            to_device_into(g.var64[:len(plans) * n64], [x for p in plans for x in p.i64])
            to_device_into(g.var32[:len(plans) * n32], [x for p in plans for x in p.i32])
            if accepted is not None:
                g.pick[:B].copy_(accepted)
                if B < plan.padded:   # padding rows: a variant of this step (older ones may
                    g.pick[B:].zero_()   # hold real rows of an earlier step there)
                self.written.forget(key, "pick")
            elif self.written.stale(key, "pick", "variant 0"):
                g.pick.zero_()
            if self.written.stale("shared", "tables", [B, plan.width] + plan.tables):
                up = to_device(plan.tables, torch.int32, g.i32.device)
                self.tables[:B, :plan.width].copy_(up.view(B, plan.width))
        g.graph.replay()
        return g.drafts[:B]
