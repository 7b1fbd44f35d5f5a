"""Qwen3-Next's grouped ``in_proj_qkvz`` / ``in_proj_ba`` load into GatedDeltaNet's flat in_proj
[q | k | v | z | b | a] (layers/linear_attention.py): the rows land where an explicit per-head
walk over the checkpoint puts them, and under tensor parallelism each rank holds exactly its key
heads' rows of every section (the layout Qwen3.5's flat tensors load into)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from transformers import AutoConfig

from harness_hybrid import SHAPE
from mtpserve.config import ModelConfig
from mtpserve.layers import linear, linear_attention
from mtpserve.layers.linear_attention import GatedDeltaNet

NK, NV, DK, DV, H = (SHAPE["linear_num_key_heads"], SHAPE["linear_num_value_heads"],
                     SHAPE["linear_key_head_dim"], SHAPE["linear_value_head_dim"],
                     SHAPE["hidden_size"])
R = NV // NK


def _grouped_checkpoint():
    """Random ``in_proj_qkvz`` [NK (2 DK + 2 R DV), H] and ``in_proj_ba`` [2 NV, H]."""
    g = torch.Generator().manual_seed(3)
    return (torch.randn(NK * (2 * DK + 2 * R * DV), H, generator=g),
            torch.randn(2 * NV, H, generator=g))


def _flat_by_hand(qkvz, ba):
    """The sections q, k, v, z, b, a of the checkpoint, walked head by head (value head
    ``h * R + j`` is key head h's j-th)."""
    per_head = 2 * DK + 2 * R * DV
    q, k, v, z, b, a = ([] for _ in range(6))
    for h in range(NK):
        rows = qkvz[h * per_head:(h + 1) * per_head]
        q.append(rows[:DK])
        k.append(rows[DK:2 * DK])
        for j in range(R):
            v.append(rows[2 * DK + j * DV:2 * DK + (j + 1) * DV])
            z.append(rows[2 * DK + R * DV + j * DV:2 * DK + R * DV + (j + 1) * DV])
            b.append(ba[h * 2 * R + j:h * 2 * R + j + 1])
            a.append(ba[h * 2 * R + R + j:h * 2 * R + R + j + 1])
    return [torch.cat(s) for s in (q, k, v, z, b, a)]


def _layer(tp: int = 1, rank: int = 0) -> GatedDeltaNet:
    """A Qwen3-Next GatedDeltaNet built as TP rank ``rank`` of ``tp``, the grouped checkpoint
    loaded through ``load_weights``'s shard ids ("qkvz", "ba")."""
    cfg = ModelConfig.from_hf(AutoConfig.for_model("qwen3_next", **SHAPE))
    with mock.patch.object(linear, "get_tp_size", lambda: tp), \
            mock.patch.object(linear, "get_tp_rank", lambda: rank), \
            mock.patch.object(linear_attention, "get_tp_size", lambda: tp), \
            mock.patch.object(linear_attention, "get_tp_rank", lambda: rank):
        layer = GatedDeltaNet(cfg, 0)
        qkvz, ba = _grouped_checkpoint()
        w = layer.in_proj.weight
        w.weight_loader(w, qkvz, "qkvz")
        w.weight_loader(w, ba, "ba")
    return layer


def test_grouped_rows_load_in_flat_order():
    layer = _layer()
    assert torch.equal(layer.in_proj.weight, torch.cat(_flat_by_hand(*_grouped_checkpoint())))


@pytest.mark.parametrize("rank", [0, 1])
def test_each_tp_rank_holds_its_key_heads_rows(rank):
    sections = _flat_by_hand(*_grouped_checkpoint())
    want = [s.chunk(2)[rank] for s in sections]   # heads split evenly over 2 ranks, in order
    layer = _layer(tp=2, rank=rank)
    assert (layer.hk, layer.hv) == (NK // 2, NV // 2)
    assert torch.equal(layer.in_proj.weight, torch.cat(want))


def test_split_gives_views_of_the_product():
    """With the flat rows, mixed q|k|v, z, b and a are views of the product: no copy."""
    layer = _layer()
    proj = torch.randn(3, layer.in_proj.out_features)
    mixed, z, b, a = layer._split(proj)
    base = proj.untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in (mixed, z, b, a))
    assert mixed.shape == (3, 2 * NK * DK + NV * DV) and z.shape == (3, NV, DV)
    assert b.shape == a.shape == (3, NK, R)
    assert torch.equal(a[:, 1, 0], proj[:, -NV + R])   # value head R: key head 1's first
