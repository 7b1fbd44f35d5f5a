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
from mtpserve.engine.forward_batch import to_device
from mtpserve.spec.mtp_chain import ChainInputs, ChainPlan, DraftChain

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
        return _ChainGraph(m, None, hidden, i64, i32, inputs)

    def forward(self, g: _ChainGraph) -> torch.Tensor:
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
        inputs, replay; return the drafts [B, plan.steps] int64 (a view of the static output)."""
        g = self.graphs[(plan.padded, plan.steps)]
        B = plan.rows
        g.hidden[:B].copy_(hidden)
        if plan.steps > 1:
            _upload_into(g.i64, plan.i64)
            n32 = len(plan.i32)
            up = to_device(plan.i32 + plan.tables, torch.int32, g.i32.device)
            g.i32.copy_(up[:n32])
            self.tables[:B, :plan.width].copy_(up[n32:].view(B, plan.width))
        g.graph.replay()
        return g.drafts[:B]

    def run_selected(self, hidden: torch.Tensor, i64: torch.Tensor | None,
                     i32: torch.Tensor | None, tables: torch.Tensor | None) -> torch.Tensor:
        """As :meth:`run` with the plan already on the device (``DraftChain.run_variants``):
        ``i64`` / ``i32`` a ChainPlan's buffers for the padded row count, ``tables`` [B, W]
        int32 (all None for one step). Returns the drafts [B, steps] int64."""
        B = hidden.shape[0]
        steps = 1 if i64 is None else i64.shape[0] // (3 * self.padded(B)) + 1
        g = self.graphs[(self.padded(B), steps)]
        g.hidden[:B].copy_(hidden)
        if i64 is not None:
            g.i64.copy_(i64)
            g.i32.copy_(i32)
            self.tables[:B, :tables.shape[1]].copy_(tables)
        g.graph.replay()
        return g.drafts[:B]


def _upload_into(dst: torch.Tensor, values: list[int]) -> None:
    """``values`` into the 1-D ``dst`` (same length): from pinned memory, without blocking the
    host, on CUDA (see ``forward_batch.to_device``)."""
    cuda = dst.device.type == "cuda"
    src = torch.tensor(values, dtype=dst.dtype, pin_memory=cuda)
    dst.copy_(src, non_blocking=cuda)
