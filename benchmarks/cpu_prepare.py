"""Host time of ``ModelRunner.prepare`` on the GPU's path (Triton attention metadata), on the CPU.

Builds decode / verify schedules of B sequences (300-750 tokens each, 1 + k query tokens, 16-token
blocks) without a model and times ``prepare`` alone: the layout of the batch
(engine/batch_layout.py), its two uploads (on the CPU a tensor from the values) and the views.
The torch attention path that CPU engines take (``build_torch_metadata``) is left out: the GPU
never runs it.

    python benchmarks/cpu_prepare.py [--batch 1,8,64] [--k 4]

Run it under two source trees (``PYTHONPATH=<tree>/src``) to compare them.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import torch

from mtpserve.engine.model_runner import ModelRunner
from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput


class FakeSeq:
    """What ``prepare`` reads of a sequence: its tokens, progress and block table."""

    def __init__(self, i: int, length: int, k: int, block_size: int = 16):
        self.request_id = f"r{i}"
        self.token_ids = list(range(100 + i, 100 + i + length))
        self.num_computed_tokens = length - 1
        first = i * 64
        self.block_table = list(range(first, first + -(-(length + k) // block_size)))
        self.state_slot = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def schedule(batch: int, k: int) -> SchedulerOutput:
    """``batch`` sequences, each verifying k drafts."""
    out = SchedulerOutput()
    for i in range(batch):
        out.scheduled.append(ScheduledSeq(FakeSeq(i, 300 + 7 * i, k), 1, list(range(5, 5 + k))))
    return out


def runner() -> types.SimpleNamespace:
    """A stand-in ModelRunner with what ``prepare`` reads, on the Triton metadata path."""
    r = types.SimpleNamespace(block_size=16, device=torch.device("cpu"),
                              kv_cache=types.SimpleNamespace(layers=[]), state_cache=None,
                              triton_attention=True, part_size=256, dtype=torch.float32)
    r.prepare = types.MethodType(ModelRunner.prepare, r)
    return r


def median_us(batch: int, k: int, calls: int = 400) -> float:
    r, sched = runner(), schedule(batch, k)
    for _ in range(50):
        r.prepare(sched)
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        r.prepare(sched)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,8,64")
    ap.add_argument("--k", type=int, default=4)
    a = ap.parse_args()
    for b in (int(x) for x in a.batch.split(",")):
        print(f"B={b} T={b * (1 + a.k)}: prepare median {median_us(b, a.k):.1f} us")


if __name__ == "__main__":
    main()
