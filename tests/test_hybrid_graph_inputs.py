"""engine/hybrid_graph.py's ``run`` on the CPU without a model: what a step writes into a
graph's static inputs (left full of garbage by earlier steps) before the replay, for a step that
fills the graph's [B, Q] block (straight copies) and one that does not (a scatter, padding
filled), and what it returns."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mtpserve.engine.cuda_graph import _Graph
from mtpserve.engine.forward_batch import ForwardBatch
from mtpserve.engine.hybrid_graph import HybridGraphRunner
from mtpserve.engine.state_cache import LinearAttnMetadata
from mtpserve.kernels.paged_attention import TritonAttentionMetadata

PAD_SLOT, PAD_STATE, PAD_ROW, VOCAB = 999, 77, 55, 5


class Snapshot:
    """Stands in for the CUDA graph: a replay records the static inputs as they are."""

    def __init__(self, g):
        self.g, self.seen = g, None

    def replay(self):
        s, plan = self.g.batch, self.g.batch.extra["gdn_plan"]
        self.seen = {n: t.clone() for n, t in dict(
            ids=s.input_ids, pos=s.positions, slot=s.slot_mapping, kv_len=s.attn.kv_len,
            tables=s.block_tables, states=s.extra["linear_attn"].slots, last=plan.last,
            rows=plan.scratch_rows, mask=plan.token_mask).items() if t is not None}


def graphs() -> HybridGraphRunner:
    cache = SimpleNamespace(pad_slot=PAD_STATE, pad_scratch_row=PAD_ROW)
    runner = SimpleNamespace(device=torch.device("cpu"), block_size=4, pad_slot=PAD_SLOT,
                             state_cache=cache, kv_cache=SimpleNamespace(layers=[]))
    gr = HybridGraphRunner(runner, 32, 3, 4, 6, 16)
    g = torch.Generator().manual_seed(0)
    for key in gr.keys():
        b, T = gr._static_batch(key), gr.tokens(key)
        graph = _Graph(None, b, torch.arange(T * 3.0).view(T, 3),
                       torch.arange(T * VOCAB * 1.0).view(T, VOCAB))
        graph.graph = Snapshot(graph)
        plan = b.extra["gdn_plan"]
        for t in (b.input_ids, b.positions, b.slot_mapping, b.attn.kv_len, b.block_tables,
                  b.extra["linear_attn"].slots, plan.last, plan.scratch_rows, plan.token_mask):
            if t is not None:   # what earlier steps left
                t.copy_(torch.randint(300, 400, t.shape, generator=g).to(t.dtype))
        gr.graphs[key] = graph
    return gr


def step(qlens: list[int], scratch_rows: list[int]) -> ForwardBatch:
    """Sequence b's tokens: ids 10 b + i, positions 20 + i, KV slots 100 b + i, keys 20 + i + 1;
    every token has a logits row; state slot 7 + b; block table row [b, b + 1]."""
    B, T = len(qlens), sum(qlens)
    toks = [(b, i) for b, q in enumerate(qlens) for i in range(q)]
    i64 = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    tables = torch.tensor([[b, b + 1] for b in range(B)], dtype=torch.int32)
    attn = TritonAttentionMetadata(torch.tensor([b for b, _ in toks], dtype=torch.int32),
                                   torch.tensor([21 + i for _, i in toks], dtype=torch.int32),
                                   tables, 4, 16)
    batch = ForwardBatch(i64([10 * b + i for b, i in toks]), i64([20 + i for _, i in toks]),
                         i64([100 * b + i for b, i in toks]), torch.zeros(B + 1, dtype=torch.int32),
                         i64(qlens), i64(qlens), tables, torch.arange(T), list(qlens),
                         list(qlens), attn=attn)
    batch.extra["linear_attn"] = LinearAttnMetadata(None, i64([7 + b for b in range(B)]),
                                                    [7 + b for b in range(B)], scratch_rows)
    return batch


def test_a_step_that_fills_the_block_overwrites_every_input():
    gr = graphs()
    hidden, logits = gr.run(step([4, 4], [3, 5]))
    seen = gr.graphs[(2, 4)].graph.seen
    assert seen["ids"].tolist() == [0, 1, 2, 3, 10, 11, 12, 13]
    assert seen["pos"].tolist() == [20, 21, 22, 23] * 2
    assert seen["slot"].tolist() == [0, 1, 2, 3, 100, 101, 102, 103]
    assert seen["kv_len"].tolist() == [21, 22, 23, 24] * 2
    assert seen["last"].tolist() == [3, 3] and seen["rows"].tolist() == [3, 5]
    assert seen["mask"].tolist() == [1.0] * 8
    assert seen["states"].tolist() == [7, 8] and seen["tables"][:, :2].tolist() == [[0, 1], [1, 2]]
    graph = gr.graphs[(2, 4)]
    assert torch.equal(hidden, graph.hidden) and hidden.data_ptr() != graph.hidden.data_ptr()
    assert torch.equal(logits, graph.logits)


def test_a_shorter_step_is_scattered_and_its_padding_filled():
    gr = graphs()
    # three sequences of 4, 2 and 1 tokens (the last one verifies nothing) in the (4, 4)
    # block: rows 0-3, 4-5, 8; the fourth sequence is padding
    hidden, logits = gr.run(step([4, 2, 1], [3, 5, -1]))
    seen, P = gr.graphs[(4, 4)].graph.seen, PAD_SLOT
    assert seen["ids"].tolist() == [0, 1, 2, 3, 10, 11, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0]
    assert seen["pos"].tolist() == [20, 21, 22, 23, 20, 21, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0]
    assert seen["slot"].tolist() == [0, 1, 2, 3, 100, 101, P, P, 200, P, P, P, P, P, P, P]
    assert seen["kv_len"].tolist() == [21, 22, 23, 24, 21, 22, 1, 1, 21, 1, 1, 1, 1, 1, 1, 1]
    assert seen["last"].tolist() == [3, 1, 0, 3]
    assert seen["rows"].tolist() == [3, 5, PAD_ROW, PAD_ROW]
    assert seen["mask"].tolist() == [1.0] * 6 + [0.0] * 2 + [1.0] + [0.0] * 7
    assert seen["states"].tolist() == [7, 8, 9, PAD_STATE]
    rows = [0, 1, 2, 3, 4, 5, 8]
    graph = gr.graphs[(4, 4)]
    assert torch.equal(hidden, graph.hidden[rows]) and torch.equal(logits, graph.logits[rows])


def test_a_decode_step_without_drafts_has_no_scratch_rows():
    gr = graphs()
    gr.run(step([1, 1], [-1, -1]))
    seen = gr.graphs[(2, 1)].graph.seen
    assert seen["ids"].tolist() == [0, 10] and seen["last"].tolist() == [0, 0]
    assert "rows" not in seen and "mask" not in seen


def step_io(qlens: list[int], scratch_rows: list[int], slots: list[int],
            tables: list[list[int]]) -> ForwardBatch:
    """:func:`step` as ``ModelRunner.prepare`` makes it: ids, positions and KV slots views of
    one ``token_io`` run, the block tables' host list, the state slots as a host list only."""
    batch = step(qlens, scratch_rows)
    io = torch.cat([batch.input_ids, batch.positions, batch.slot_mapping])
    T = batch.num_tokens
    batch.input_ids, batch.positions, batch.slot_mapping = io[:T], io[T:2 * T], io[2 * T:]
    batch.token_io = io
    batch.block_tables = torch.tensor(tables, dtype=torch.int32)
    batch.block_tables_cpu = [x for row in tables for x in row]
    batch.extra["linear_attn"] = LinearAttnMetadata(None, None, slots, scratch_rows,
                                                    torch.device("cpu"))
    return batch


def test_inputs_that_hold_the_step_already_are_not_written_again():
    gr = graphs()
    key, g = (1, 4), gr.graphs[(1, 4)]
    gr.run(step_io([4], [2], [7], [[5, 6]]))
    seen = g.graph.seen
    assert seen["ids"].tolist() == [0, 1, 2, 3] and seen["slot"].tolist() == [0, 1, 2, 3]
    assert seen["states"].tolist() == [7] and seen["tables"][0, :2].tolist() == [5, 6]
    assert seen["rows"].tolist() == [2] and seen["last"].tolist() == [3]
    # what nothing but a step writes, marked: a step with the same slots, scratch rows, table
    # and layout leaves them, a step with other values rewrites them
    s, plan = g.batch, g.batch.extra["gdn_plan"]
    for t in (s.extra["linear_attn"].slots, plan.scratch_rows, plan.last, s.block_tables):
        t.fill_(-9)
    gr.run(step_io([4], [2], [7], [[5, 6]]))
    seen = g.graph.seen
    assert seen["states"].tolist() == [-9] and seen["rows"].tolist() == [-9]
    assert seen["last"].tolist() == [-9] and seen["tables"][0, :2].tolist() == [-9, -9]
    assert seen["ids"].tolist() == [0, 1, 2, 3]                 # always written
    gr.run(step_io([4], [3], [8], [[5, 6, 9]]))                 # new slot, row and block
    seen = g.graph.seen
    assert seen["states"].tolist() == [8] and seen["rows"].tolist() == [3]
    assert seen["tables"][0, :3].tolist() == [5, 6, 9]
    assert seen["last"].tolist() == [-9]                        # the layout is still full
    assert gr.written.stale(key, "layout", "full") is False


def test_a_full_step_after_a_padded_one_restores_the_layout():
    gr = graphs()
    g = gr.graphs[(2, 4)]
    gr.run(step_io([4, 4], [3, 5], [7, 8], [[0, 1], [1, 2]]))
    gr.run(step_io([4, 2], [3, 5], [7, 8], [[0, 1], [1, 2]]))   # padded in the same block
    seen = g.graph.seen
    assert seen["last"].tolist() == [3, 1] and seen["mask"].tolist() == [1.0] * 6 + [0.0] * 2
    gr.run(step_io([4, 4], [3, 5], [7, 8], [[0, 1], [1, 2]]))
    seen = g.graph.seen
    assert seen["last"].tolist() == [3, 3] and seen["mask"].tolist() == [1.0] * 8
    assert seen["rows"].tolist() == [3, 5] and seen["states"].tolist() == [7, 8]
    assert seen["ids"].tolist() == [0, 1, 2, 3, 10, 11, 12, 13]
    assert seen["kv_len"].tolist() == [21, 22, 23, 24] * 2


def test_fewer_sequences_than_the_block_pad_the_state_slots():
    gr = graphs()
    gr.run(step_io([1] * 3, [-1] * 3, [7, 8, 9], [[4], [5], [6]]))  # (4, 1): a padding row
    seen = gr.graphs[(4, 1)].graph.seen
    assert seen["states"].tolist() == [7, 8, 9, PAD_STATE]


def test_a_full_step_after_a_padded_one_with_other_rows_restores_its_scratch_rows():
    gr = graphs()
    g = gr.graphs[(2, 4)]
    gr.run(step_io([4, 4], [3, 5], [7, 8], [[0, 1], [1, 2]]))
    gr.run(step_io([4, 2], [6, 1], [7, 8], [[0, 1], [1, 2]]))   # padded: other scratch rows
    assert g.graph.seen["rows"].tolist() == [6, 1]
    gr.run(step_io([4, 4], [3, 5], [7, 8], [[0, 1], [1, 2]]))
    assert g.graph.seen["rows"].tolist() == [3, 5]


def test_tables_written_without_host_values_or_of_another_shape_are_written_again():
    gr = graphs()
    g = gr.graphs[(2, 1)]
    gr.run(step_io([1, 1], [-1, -1], [7, 8], [[5], [6]]))
    no_host = step_io([1, 1], [-1, -1], [7, 8], [[9], [9]])
    no_host.block_tables_cpu = None                              # values the memo never saw
    gr.run(no_host)
    assert g.graph.seen["tables"][:, 0].tolist() == [9, 9]
    gr.run(step_io([1, 1], [-1, -1], [7, 8], [[5], [6]]))
    assert g.graph.seen["tables"][:, 0].tolist() == [5, 6]
    # the same twelve values as 3 rows of 4 blocks, then as 4 rows of 3 (both the (4, 1) graph)
    flat = list(range(1, 13))
    gr.run(step_io([1] * 3, [-1] * 3, [7, 8, 9], [flat[i:i + 4] for i in (0, 4, 8)]))
    gr.run(step_io([1] * 4, [-1] * 4, [7, 8, 9, 10], [flat[i:i + 3] for i in (0, 3, 6, 9)]))
    seen = gr.graphs[(4, 1)].graph.seen["tables"]
    assert seen[:, :3].tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]


def test_a_full_block_with_a_row_without_logits_returns_only_the_logits_rows():
    gr = graphs()
    batch = step_io([1, 1], [-1, -1], [7, 8], [[5], [6]])
    batch.logits_indices = torch.tensor([1])     # the first row: a prefill chunk, no logits
    hidden, logits = gr.run(batch)
    g = gr.graphs[(2, 1)]
    assert hidden.shape[0] == 2 and torch.equal(logits, g.logits[[1]])


def test_the_step_takes_the_graphs_state_slots_as_its_own():
    """A step whose state slots were never uploaded (``prepare`` leaves them to whoever reads
    them) gets the graph's static slots once written: the device rollback after the verify
    (spec/draft_ahead.py ``commit_ahead``) reads them without an upload of its own."""
    gr = graphs()
    batch = step_io([4, 4], [3, 5], [7, 8], [[0, 1], [1, 2]])
    gr.run(batch)
    static = gr.graphs[(2, 4)].batch.extra["linear_attn"].slots
    meta = batch.extra["linear_attn"]
    assert meta.slots.data_ptr() == static.data_ptr() and meta.slots.tolist() == [7, 8]
    padded = step_io([4, 2, 1], [3, 5, -1], [7, 8, 9], [[0, 1], [1, 2], [2, 3]])
    gr.run(padded)                                   # three of the (4, 4) block's rows
    assert padded.extra["linear_attn"].slots.tolist() == [7, 8, 9]
