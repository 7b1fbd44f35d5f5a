"""CUDA graphs for decode and verify steps.

On the GPU, an eager step of a small model spends most of its time launching kernels from Python
(~17 ms per step for a 30-layer model on the H200 here). A captured graph replays all of a step's
kernels with one launch. Graphs need fixed shapes and fixed memory, so for each size in a ladder
of token counts the forward (hidden states and logits of every token) is captured once at start
over static input buffers; a step with T tokens pads to the next captured size, copies its inputs
into that graph's buffers and replays it. Only steps where every sequence computes just its newest
token (plus drafts) qualify: their attention goes through the per-token Triton kernel, whose
launch shape depends only on T. Padding tokens write their K/V to a reserved slot and attend to
one key. Prefill steps run eagerly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from mtpserve.engine.forward_batch import ForwardBatch
from mtpserve.engine.graph_inputs import WrittenInputs, write_tables
from mtpserve.kernels.compile_ahead import compiling_ahead
from mtpserve.kernels.paged_attention import TritonAttentionMetadata

logger = logging.getLogger(__name__)

SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512, 640,
         768, 1024)


# eager forwards before a capture: of the first key, of every later one
WARM_UPS = (2, 1)


def capture_graphs(keys: list, make_static: Callable, forward: Callable) -> dict:
    """One CUDA graph of ``forward(make_static(key))`` per key, largest (last) key first, in one
    shared memory pool: ``{key: (graph, static inputs, static outputs)}``.

    First a dry forward of every key compiles their Triton kernels in parallel
    (kernels/compile_ahead.py); then each key runs eagerly before its capture (cuBLAS picks
    its kernels for the key's shapes, lazy buffers are made): the first (largest) key twice,
    the others once (``WARM_UPS``; with two each, the hybrid's 40 graphs took 10.6 s to
    capture on an H100, BENCHMARKS.md session 35)."""
    statics = {key: make_static(key) for key in reversed(keys)}
    with compiling_ahead() as ahead:
        if ahead:
            for static in statics.values():
                forward(static)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    out = {}
    for i, (key, static) in enumerate(statics.items()):
        for _ in range(WARM_UPS[min(i, 1)]):
            forward(static)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            result = forward(static)
        out[key] = (g, static, result)
    torch.cuda.synchronize()
    return out


def graph_sizes(limit: int) -> tuple[int, ...]:
    """The captured token counts: the ladder up to the first size >= ``limit``."""
    out = [s for s in SIZES if s < limit]
    return tuple(out + [s for s in SIZES if s >= limit][:1])


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    batch: ForwardBatch          # the static inputs
    hidden: torch.Tensor         # [T, H] static output
    logits: torch.Tensor         # [T, vocab] static output


class CudaGraphRunner:
    """Captured forwards of ``runner.model`` for token counts in ``sizes``.

    Args:
        runner: the ModelRunner (model, KV cache, block size, pad slot).
        max_seqs: most sequences in a captured step; max_blocks: block-table width
            (``ceil(max_model_len / block_size)``).
    """

    def __init__(self, runner, sizes: tuple[int, ...], max_seqs: int, max_blocks: int,
                 part_size: int):
        self.runner = runner
        self.sizes = sorted(sizes)
        self.max_seqs, self.max_blocks, self.part_size = max_seqs, max_blocks, part_size
        self.graphs: dict = {}
        self.costs: dict = {}
        self.written = WrittenInputs()   # what each graph's static inputs hold

    def keys(self) -> list:
        """What a graph is captured for, smallest first: here its token count."""
        return list(self.sizes)

    @staticmethod
    def tokens(key) -> int:
        """Token count of the graph captured for ``key``."""
        return key

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every key, largest first, in one shared memory pool."""
        t0 = time.perf_counter()
        for key, (g, batch, (hidden, logits)) in capture_graphs(
                self.keys(), self._static_batch, self._forward).items():
            self.graphs[key] = _Graph(g, batch, hidden, logits)
        self.costs = self.measure()
        first, last = self.keys()[0], self.keys()[-1]
        logger.info("captured %d CUDA graphs (%d..%d tokens) in %.1f s; replay %.3f ms at %d "
                    "token(s), %.3f ms at %d", len(self.graphs), self.tokens(first),
                    self.tokens(last), time.perf_counter() - t0, self.costs[first] * 1e3,
                    self.tokens(first), self.costs[last] * 1e3, self.tokens(last))

    def _forward(self, batch: ForwardBatch):
        hidden = self.runner.model(batch)
        return hidden, self.runner.model.compute_logits(hidden)

    def _static_batch(self, size: int) -> ForwardBatch:
        dev, i64, i32 = self.runner.device, torch.int64, torch.int32
        rows = min(size, self.max_seqs)
        tables = torch.zeros(rows, self.max_blocks, dtype=i32, device=dev)
        rows_io = torch.ones(2 * size, dtype=i32, device=dev)   # table rows, key counts
        rows_io[:size] = 0
        attn = TritonAttentionMetadata(rows_io[:size], rows_io[size:], tables,
                                       self.runner.block_size, self.part_size, rows_io=rows_io)
        token_io = torch.zeros(3 * size, dtype=i64, device=dev)   # ids, positions, KV slots
        token_io[2 * size:] = self.runner.pad_slot
        batch = ForwardBatch(
            input_ids=token_io[:size], positions=token_io[size:2 * size],
            slot_mapping=token_io[2 * size:], token_io=token_io,
            query_start_loc=torch.zeros(rows + 1, dtype=i32, device=dev),
            query_lens=torch.ones(rows, dtype=i64, device=dev),
            seq_lens=torch.ones(rows, dtype=i64, device=dev), block_tables=tables,
            logits_indices=torch.arange(size, dtype=i64, device=dev),
            query_lens_cpu=[1] * rows, seq_lens_cpu=[1] * rows, attn=attn)
        batch.kv_caches = self.runner.kv_cache.layers
        return batch

    @torch.inference_mode()
    def measure(self, repeats: int = 5) -> dict[int, float]:
        """Seconds per replay of each captured graph by key (median of ``repeats``): the cost of
        a step by its token count, which the speculation policy uses to price drafts."""
        cost = {}
        for key, g in self.graphs.items():
            times = []
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                g.graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            cost[key] = sorted(times)[len(times) // 2]
        return cost

    def step_cost(self, tokens: int) -> float | None:
        """Measured seconds of a step of ``tokens`` tokens (the graph it would replay), or None
        beyond the largest graph."""
        fits = [self.tokens(k) for k in self.costs if self.tokens(k) >= tokens]
        if not fits:
            return None
        size = min(fits)
        return max(c for k, c in self.costs.items() if self.tokens(k) == size)

    # ---- per step ----------------------------------------------------------------------------
    def can_run(self, batch: ForwardBatch) -> bool:
        return (isinstance(batch.attn, TritonAttentionMetadata) and bool(self.graphs)
                and batch.num_tokens <= self.sizes[-1] and batch.num_seqs <= self.max_seqs
                and batch.block_tables.shape[1] <= self.max_blocks)

    def run(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the smallest graph that fits; return (hidden [T, H], logits [N, vocab])."""
        g = self.replay(batch)
        return g.hidden[:batch.num_tokens], g.logits[batch.logits_indices]

    def graph_for(self, batch: ForwardBatch) -> _Graph:
        """The smallest captured graph that holds ``batch``'s tokens."""
        return self.graphs[next(s for s in self.sizes if s >= batch.num_tokens)]

    def replay(self, batch: ForwardBatch) -> _Graph:
        """Copy ``batch`` into the smallest graph that fits (padding its other tokens) and
        replay it; return that graph (its outputs hold the step's until its next replay)."""
        T, B = batch.num_tokens, batch.num_seqs
        g = self.graph_for(batch)
        s, m, size = g.batch, batch.attn, g.batch.input_ids.shape[0]   # size: the graph's key
        full = T == size   # the step fills the graph: its runs of inputs in one copy each
        if full and batch.token_io is not None:
            s.token_io.copy_(batch.token_io)
        else:
            s.input_ids[:T].copy_(batch.input_ids)
            s.positions[:T].copy_(batch.positions)
            s.slot_mapping[:T].copy_(batch.slot_mapping)
        if full and m.rows_io is not None:
            s.attn.rows_io.copy_(m.rows_io)
        else:
            s.attn.table_row[:T].copy_(m.table_row)
            s.attn.kv_len[:T].copy_(m.kv_len)
        if not full:   # padding tokens: the pad slot, one key of table row 0
            s.slot_mapping[T:].fill_(self.runner.pad_slot)
            s.attn.table_row[T:].zero_()
            s.attn.kv_len[T:].fill_(1)
        write_tables(self.written, size, s.block_tables, batch)
        g.graph.replay()
        return g
