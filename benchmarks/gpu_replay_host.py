"""What a CUDA-graph replay costs the host: the time ``graph.replay()`` takes to return, by graph.

The hybrid MTP step replays three graphs (the target's verify, the MTP's observe, the draft
chain) and keeps the host about as busy as the device (BENCHMARKS.md, session 29): this says
how much of that the launches themselves are, against a small ``copy_`` for scale.

    python benchmarks/gpu_replay_host.py [--shape qwen3-next-3b] [--json OUT.json]

For every captured graph of one row (the target's by (B, Q), the MTP's observe by token count,
the chain by (rows, steps)) it replays the graph ``--repeats`` times, each after a
synchronize, and prints the median host microseconds until ``replay()`` returned. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from gpu_decode import build
from mtpserve.config import SpeculativeConfig


def host_us(fn, repeats: int) -> float:
    """Median host microseconds of ``fn()`` over ``repeats`` calls, each on an idle device."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def graphs_of(eng) -> dict[str, object]:
    """{label: torch CUDAGraph} of one row: the target's, the MTP observe's, the chain's."""
    out = {}
    for key, g in eng.runner.graphs.graphs.items():
        if (key[0] if isinstance(key, tuple) else key) == 1:
            out[f"target {key}"] = g.graph
    p = eng.proposer
    mtp_graphs = getattr(p.runner, "graphs", None)
    if mtp_graphs is not None:
        for key, g in mtp_graphs.graphs.items():
            if key <= 4:
                out[f"mtp observe {key} tokens"] = g.graph
    for key, g in p.chain.graphs.graphs.items():
        if key[0] == 1:
            out[f"chain {key}"] = g.graph
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-next-3b")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json")
    a = ap.parse_args()
    eng, _ = build(a.shape, False, SpeculativeConfig(algorithm="nextn", num_steps=3,
                                                     adaptive=False))
    small = torch.zeros(64, dtype=torch.int64, device="cuda")
    src = torch.ones_like(small)
    rows = {"copy_ of 64 int64": host_us(lambda: small.copy_(src), a.repeats)}
    for label, graph in graphs_of(eng).items():
        rows[label] = host_us(graph.replay, a.repeats)
        print(f"{label:28} {rows[label]:8.1f} us host per replay")
    print(f"{'copy_ of 64 int64':28} {rows['copy_ of 64 int64']:8.1f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
