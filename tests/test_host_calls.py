"""benchmarks/host_calls.py: the small torch calls an engine step makes, counted by op and by
the mtpserve line that made them, and the torch entry points put back afterwards."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

from host_calls import calls_table, torch_calls  # noqa: E402

from mtpserve.engine.forward_batch import to_device  # noqa: E402


def test_calls_are_counted_by_op_and_mtpserve_line():
    copy_, tensor = torch.Tensor.copy_, torch.tensor
    with torch_calls() as calls:
        for _ in range(3):
            to_device([1, 2, 3], torch.int64, "cpu")
        torch.zeros(2).copy_(torch.ones(2))           # from here: no mtpserve line
    sites = {(op, site.split(":")[0], site.split(" ")[-1]): c for (op, site), (c, _) in calls.items()}
    assert sites[("torch.tensor", "engine/forward_batch.py", "to_device")] == 3
    assert sites[("Tensor.copy_", "?", "?")] == 1
    assert sites[("torch.zeros", "?", "?")] == sites[("torch.ones", "?", "?")] == 1
    assert torch.Tensor.copy_ is copy_ and torch.tensor is tensor
    table = calls_table(calls, steps=3).splitlines()
    assert table[0].startswith("torch calls on the host: 2.0 per step")
    assert len(table) == 2 + len(calls)
