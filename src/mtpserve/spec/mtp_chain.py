"""Greedy MTP drafting as one chain: all draft steps of a batch from one host-side layout.

The step-by-step loop (``MTPProposer._draft_loop``) runs, per further draft, a
``ModelRunner.prepare`` (Python lists, uploads) and an MTP forward, with the LM head and the
argmax eager in between: on the H200 the GPU idles most of a speculative step waiting for it.
For greedy drafts nothing the host does depends on a drafted token, so the whole chain is laid
out up front and runs on the device without a round trip:

    ids_1 = argmax(lm_head(y_0))                          y_0: MTP output at position L - 2
    y_s = mtp(ids_s, y_{s-1}) at position L - 2 + s       for s = 1 .. m - 1
    ids_{s+1} = argmax(lm_head(y_s))

(``lm_head``: the draft head, spec/draft_head.py: the target's, or FR-Spec's over a token map.)

(L = the sequence's tokens, m = the most drafts any row asks for). Every row runs all m steps;
a row with budget b < m keeps its first b drafts. Its steps s >= b are dead: they write K/V to
the runner's pad slot and attend over the keys of its last real step's position, so they touch
no block they do not own, need no block beyond its budget and stay inside the RoPE table.
Chained K/V entries are forgotten afterwards anyway (see mtp.py).

Each chained step is a decode batch of one query token per row in the per-token attention
layout (``TritonAttentionMetadata``; plain PyTorch on the CPU), so the same forward is captured
in a CUDA graph per (rows, steps) (mtp_chain_graph.py) and runs eagerly elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtpserve.engine.forward_batch import ForwardBatch, to_device
from mtpserve.kernels.paged_attention import TritonAttentionMetadata
from mtpserve.spec.draft_head import FullVocabHead


@dataclass
class ChainRow:
    """One drafting sequence: its shadow's ``block_table`` (blocks for positions up to
    ``num_tokens - 3 + budget`` already allocated), ``num_tokens`` L of the target sequence,
    ``budget`` b >= 1 drafts wanted."""

    block_table: list[int]
    num_tokens: int
    budget: int


@dataclass
class ChainPlan:
    """The host-side layout of a chain of ``steps`` drafts over ``padded`` rows (the first
    ``rows`` real; the others write the pad slot, attend one key of table row 0). S = steps - 1.

    ``i64``: positions [S, padded], KV slots [S, padded], context lengths [S, padded], flat;
    ``i32``: block-table row [padded], keys attended [S, padded]; ``tables``: [rows, width]
    block tables, flat, padded with 0.
    """

    rows: int
    padded: int
    steps: int
    i64: list[int]
    i32: list[int]
    tables: list[int]
    width: int


def plan_chain(rows: list[ChainRow], steps: int, padded: int, block_size: int,
               pad_slot: int, width: int | None = None) -> ChainPlan:
    """Lay out chained steps 1..steps-1 of ``rows`` (step s of a row at position L - 2 + s while
    s < its budget, else dead: the position of its last real step, KV to ``pad_slot``).
    ``width``: block-table columns (default: the fewest the rows' keys need)."""
    B, bs = len(rows), block_size
    pos, slots = [], []
    for s in range(1, steps):
        for r in rows:
            if s < r.budget:
                p = r.num_tokens - 2 + s
                pos.append(p)
                slots.append(r.block_table[p // bs] * bs + p % bs)
            else:
                pos.append(r.num_tokens - 3 + r.budget)
                slots.append(pad_slot)
        pos.extend([0] * (padded - B))
        slots.extend([pad_slot] * (padded - B))
    kv = [p + 1 for p in pos]
    width = width or table_width(rows, bs)
    tables = [x for r in rows for x in _row(r.block_table, width)]
    return ChainPlan(B, padded, steps, pos + slots + kv, list(range(B)) + [0] * (padded - B) + kv,
                     tables, width)


def pick_variants(variants: torch.Tensor, num_variants: int, pick: torch.Tensor,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """One ChainPlan list of P rows from ``num_variants`` of them: ``variants`` the plans'
    lists (int64 or int32) back to back, flat; ``pick`` [P] int64 on the device, row p's
    variant (the innermost axis of every list is the row). Returns the [n P] list (written
    into ``out`` if given); one gather, no host sync (graph-capturable)."""
    P = pick.shape[0]
    n = variants.shape[0] // (num_variants * P)
    index = pick.view(1, 1, P).expand(1, n, P)
    dst = None if out is None else out.view(1, n, P)
    return torch.gather(variants.view(num_variants, n, P), 0, index, out=dst).view(-1)


def table_width(rows: list[ChainRow], block_size: int) -> int:
    """Block-table columns a chain over ``rows`` reads (its last real step's keys)."""
    return max((r.num_tokens - 3 + max(r.budget, 1)) // block_size + 1 for r in rows)


def _row(table: list[int], width: int) -> list[int]:
    return table[:width] + [0] * (width - len(table))


@dataclass
class ChainInputs:
    """Device-side layout of a :class:`ChainPlan` (views of one int64 and one int32 buffer).

    ``positions``, ``slots``, ``seq_lens`` [S, P] int64; ``table_row`` [P] int32; ``kv_len``
    [S, P] int32; ``block_tables`` [R, W] int32 (R >= the real rows).
    """

    positions: torch.Tensor
    slots: torch.Tensor
    seq_lens: torch.Tensor
    table_row: torch.Tensor
    kv_len: torch.Tensor
    block_tables: torch.Tensor

    @classmethod
    def view(cls, i64: torch.Tensor, i32: torch.Tensor, tables: torch.Tensor, padded: int,
             steps: int) -> ChainInputs:
        """Views of ``i64`` [3 S P] and ``i32`` [P + S P] laid out as ChainPlan's lists."""
        S, P = steps - 1, padded
        three = i64.view(3, S, P)
        return cls(three[0], three[1], three[2], i32[:P], i32[P:].view(S, P), tables)

    @staticmethod
    def sizes(padded: int, steps: int) -> tuple[int, int]:
        """Lengths of the int64 and int32 buffers."""
        S = steps - 1
        return 3 * S * padded, padded + S * padded


class DraftChain:
    """Greedy chained drafting with ``target.mtp`` over the KV pool of ``runner``, each step's
    ids from ``head.greedy`` (a spec/draft_head.py head; default: the target's full LM head).

    ``graphs``: a ChainGraphs (mtp_chain_graph.py) once captured on CUDA, else None (eager).
    """

    def __init__(self, target, runner, head=None):
        self.target, self.mtp, self.runner = target, target.mtp, runner
        self.head = head if head is not None else FullVocabHead(target)
        self.graphs = None
        self._consts: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @torch.inference_mode()
    def run(self, hidden: torch.Tensor, rows: list[ChainRow], steps: int) -> torch.Tensor:
        """[B, steps] int64 drafts on the device: a graph replay when one fits, else eager."""
        B, r = len(rows), self.runner
        hidden = hidden.to(r.dtype)
        g = self.graphs
        if g is not None and g.fits(B, steps):
            plan = plan_chain(rows, steps, g.padded(B), r.block_size, r.pad_slot)
            return g.run(hidden, plan)
        if steps == 1:   # no chained step: nothing to lay out
            return self.forward(hidden, None, 1)
        plan = plan_chain(rows, steps, B, r.block_size, r.pad_slot)
        return self.forward(hidden, self.upload(plan), steps)

    @torch.inference_mode()
    def run_variants(self, hidden: torch.Tensor, variants: list[list[ChainRow]],
                     accepted: torch.Tensor, steps: int) -> torch.Tensor:
        """Drafts [B, steps] int64 on the device for rows whose layout the host does not know
        yet: ``variants[v]`` are the B rows as they are if v drafts get accepted (same block
        tables), ``accepted`` [B] int64 on the device picks each row's variant. The host lays
        out every variant (spec/draft_ahead.py: the chain starts before the host has read
        the acceptance back), the device selects per row; no host sync."""
        B, r, g = len(variants[0]), self.runner, self.graphs
        graph = g is not None and g.fits(B, steps)
        if steps == 1:
            return g.run(hidden, plan_chain(variants[0], 1, g.padded(B), r.block_size,
                                            r.pad_slot)) if graph else \
                self.forward(hidden.to(r.dtype), None, 1)
        P = g.padded(B) if graph else B
        width = max(table_width(rows, r.block_size) for rows in variants)
        plans = [plan_chain(rows, steps, P, r.block_size, r.pad_slot, width) for rows in variants]
        if graph:   # the graph gathers each row's variant itself
            return g.run_variants(hidden, plans, accepted)
        dev, V = r.device, len(plans)
        n64, n32 = len(plans[0].i64), len(plans[0].i32)
        # one upload: every variant's int64 lists, then their int32 lists and the tables
        up = to_device([x for p in plans for x in p.i64] + [x for p in plans for x in p.i32]
                       + plans[0].tables, torch.int64, dev)
        small = up[V * n64:].to(torch.int32)
        i32, tables = small[:V * n32], small[V * n32:].view(B, width)
        i64 = pick_variants(up[:V * n64], V, accepted)
        i32 = pick_variants(i32, V, accepted)
        inputs = ChainInputs.view(i64, i32, tables, P, steps)
        return self.forward(hidden.to(r.dtype), inputs, steps)

    def upload(self, plan: ChainPlan) -> ChainInputs:
        """``plan`` on the runner's device: two host-to-device copies."""
        dev = self.runner.device
        n32 = len(plan.i32)
        i32 = to_device(plan.i32 + plan.tables, torch.int32, dev)
        return ChainInputs.view(to_device(plan.i64, torch.int64, dev), i32[:n32],
                                i32[n32:].view(plan.rows, plan.width), plan.padded, plan.steps)

    def forward(self, hidden: torch.Tensor, inputs: ChainInputs | None,
                steps: int) -> torch.Tensor:
        """The device work: ``hidden`` [P, H] (runner dtype) -> drafts [P, steps] int64
        (``inputs`` None only for steps == 1). No host sync on CUDA (graph-capturable)."""
        ids = self.head.greedy(hidden)
        out = [ids]
        for s in range(1, steps):
            batch = self.step_batch(inputs, s - 1, ids)
            hidden = self.mtp(ids, hidden, batch, step=s)
            ids = self.head.greedy(hidden)
            out.append(ids)
        return torch.stack(out, dim=1)

    def step_batch(self, inputs: ChainInputs, j: int, ids: torch.Tensor) -> ForwardBatch:
        """Chained step j + 1 as a decode batch of one token per row over the MTP's KV pool.
        Its host lists are placeholders (as in a captured graph's static batch): the MTP layer
        reads only the device tensors."""
        P = ids.shape[0]
        qlens, qstart, rows = self._constants(P)
        r = self.runner
        attn = TritonAttentionMetadata(inputs.table_row, inputs.kv_len[j], inputs.block_tables,
                                       r.block_size, r.part_size)
        batch = ForwardBatch(
            input_ids=ids, positions=inputs.positions[j], slot_mapping=inputs.slots[j],
            query_start_loc=qstart, query_lens=qlens, seq_lens=inputs.seq_lens[j],
            block_tables=inputs.block_tables, logits_indices=rows, query_lens_cpu=[1] * P,
            seq_lens_cpu=[1] * P, attn=attn)
        batch.kv_caches = r.kv_cache.layers
        return batch

    def _constants(self, P: int):
        """(query lens [P] int64 ones, query starts [P + 1] int32, rows [P] int64), made once
        per row count."""
        c = self._consts.get(P)
        if c is None:
            dev = self.runner.device
            c = self._consts[P] = (torch.ones(P, dtype=torch.int64, device=dev),
                                   torch.arange(P + 1, dtype=torch.int32, device=dev),
                                   torch.arange(P, dtype=torch.int64, device=dev))
        return c
