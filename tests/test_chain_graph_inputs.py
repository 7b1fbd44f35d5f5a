"""spec/mtp_chain_graph.py's static inputs on the CPU without a model: what a chain graph's
forward sees after a step writes its plan (``run``) or its variants (``run_variants``, the
graph gathering each row's), and that padding rows never take an older step's real rows."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mtpserve.spec.mtp_chain import ChainRow, plan_chain
from mtpserve.spec.mtp_chain_graph import ChainGraphs

PAD, BS, K = 999, 4, 3


class Recorded:
    """Stands in for the DraftChain: records the positions and KV slots each step reads."""

    def __init__(self):
        self.runner = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32,
                                      pad_slot=PAD, model_config=SimpleNamespace(hidden_size=2))
        self.seen = None

    def forward(self, hidden, inputs, steps):
        self.seen = (inputs.positions.clone(), inputs.slots.clone())
        return torch.zeros(hidden.shape[0], steps, dtype=torch.int64)


class Replay:
    def __init__(self, graphs, g):
        self.graphs, self.g = graphs, g

    def replay(self):
        self.g.drafts.copy_(self.graphs.forward(self.g))


def chain_graphs() -> tuple[ChainGraphs, Recorded]:
    chain = Recorded()
    graphs = ChainGraphs(chain, 4, 8, K)
    for key in graphs.keys():
        g = graphs.static(key)
        g.drafts = torch.zeros(key[0], key[1], dtype=torch.int64)
        g.graph = Replay(graphs, g)
        graphs.graphs[key] = g
    return graphs, chain


def rows(n: int, length: int) -> list[ChainRow]:
    """n sequences of ``length`` tokens, sequence b's blocks 10 b, 10 b + 1, ..."""
    return [ChainRow([10 * b + i for i in range(4)], length, K) for b in range(n)]


def variants(n: int, accepted_max: int, padded: int = 4) -> list:
    return [plan_chain(rows(n, 6 + v), K, padded, BS, PAD, width=4)
            for v in range(accepted_max + 1)]


def test_each_row_takes_its_variant_and_padding_rows_stay_padding():
    graphs, chain = chain_graphs()
    hidden = torch.zeros(4, 2)
    # four rows, the last two accepting 3 drafts (variant 3: positions 8 + 1 + s)
    graphs.run_variants(hidden, variants(4, 3), torch.tensor([0, 1, 3, 3]))
    pos, slots = chain.seen
    assert pos[:, :4].tolist() == [[5, 6, 8, 8], [6, 7, 9, 9]]
    assert slots[:, 2].tolist() == [22 * BS, 22 * BS + 1]   # row 2: block 22, positions 8, 9
    # then two rows with one variant: rows 2, 3 of the same 4-row graph are padding, though the
    # graph's variant 3 still holds the last step's real rows there
    graphs.run_variants(hidden[:2], variants(2, 0), torch.tensor([0, 0]))
    pos, slots = chain.seen
    assert pos[:, :2].tolist() == [[5, 5], [6, 6]]
    assert slots[:, 2:].tolist() == [[PAD, PAD], [PAD, PAD]]
    assert pos[:, 2:].tolist() == [[0, 0], [0, 0]]


def test_a_plain_run_after_variants_takes_its_plan_in_every_row():
    graphs, chain = chain_graphs()
    graphs.run_variants(torch.zeros(4, 2), variants(4, 2), torch.tensor([2, 2, 2, 2]))
    graphs.run(torch.zeros(3, 2), plan_chain(rows(3, 10), K, 4, BS, PAD, width=4))
    pos, slots = chain.seen
    assert pos.tolist() == [[9, 9, 9, 0], [10, 10, 10, 0]]
    assert slots[:, 3].tolist() == [PAD, PAD]


def test_a_plain_run_after_variants_after_a_plain_run_zeroes_the_picks_again():
    graphs, chain = chain_graphs()
    graphs.run(torch.zeros(4, 2), plan_chain(rows(4, 10), K, 4, BS, PAD, width=4))
    graphs.run_variants(torch.zeros(4, 2), variants(4, 2), torch.tensor([2, 2, 2, 2]))
    graphs.run(torch.zeros(4, 2), plan_chain(rows(4, 12), K, 4, BS, PAD, width=4))
    assert chain.seen[0].tolist() == [[11] * 4, [12] * 4]


def test_the_shared_block_tables_follow_every_graph_that_writes_them():
    graphs, chain = chain_graphs()
    one = [ChainRow([7, 8, 9, 10], 10, K)]
    two = [ChainRow([3, 4, 5, 6], 10, K), ChainRow([1, 2, 11, 12], 10, K)]
    graphs.run(torch.zeros(1, 2), plan_chain(one, K, 1, BS, PAD, width=4))
    assert graphs.tables[0, :4].tolist() == [7, 8, 9, 10]
    graphs.run(torch.zeros(2, 2), plan_chain(two, K, 2, BS, PAD, width=4))
    graphs.run(torch.zeros(1, 2), plan_chain(one, K, 1, BS, PAD, width=4))
    assert graphs.tables[0, :4].tolist() == [7, 8, 9, 10]


def test_each_graph_zeroes_its_own_picks():
    graphs, chain = chain_graphs()
    graphs.run(torch.zeros(1, 2), plan_chain(rows(1, 10), K, 1, BS, PAD, width=4))
    graphs.run_variants(torch.zeros(2, 2), variants(2, 2, padded=2), torch.tensor([2, 1]))
    graphs.run(torch.zeros(2, 2), plan_chain(rows(2, 12), K, 2, BS, PAD, width=4))
    assert chain.seen[0].tolist() == [[11, 11], [12, 12]]
