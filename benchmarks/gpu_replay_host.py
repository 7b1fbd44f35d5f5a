"""What a CUDA-graph replay costs the host (the time ``graph.replay()`` takes to return) and the
device (CUDA events around it), by graph.

The hybrid MTP step replays three graphs (the target's verify, the MTP's observe, the draft
chain) and keeps the host about as busy as the device (BENCHMARKS.md, session 29): this says
how much of that the launches themselves are, against a small ``copy_`` for scale.

    python benchmarks/gpu_replay_host.py [--shape qwen3-next-3b] [--json OUT.json]

For every captured graph of one row (the target's by (B, Q), the MTP's observe by token count,
the chain by (rows, steps)) it replays the graph ``--repeats`` times, each after a
synchronize, and prints the median host microseconds until ``replay()`` returned and the median device
microseconds of a replay. ``--token-map-size N``: the draft chain through FR-Spec's head over
ids 0..N-1; ``--draft-head-fp8``: through its FP8 copy. ``--trace DIR``: each graph's
kernels by what they add to its replay
(``DIR/<graph>-chain.txt``, gpu_profile.py's chain table). Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from gpu_decode import build, first_ids_map
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


def device_us(fn, repeats: int) -> float:
    """Median device microseconds of ``fn()`` (CUDA events around each call, on an idle
    device)."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


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


def trace_graph(graph, label: str, out_dir: str, repeats: int = 20) -> str:
    """Profile ``repeats`` replays of ``graph`` and write what each of its kernels adds to the
    replay's span (gpu_profile.py's chain table) to ``out_dir/<label>-chain.txt``; return the
    path."""
    from torch.profiler import ProfilerActivity, profile

    from gpu_profile import chain_table

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    path = os.path.join(out_dir, label.replace(" ", "_").replace(",", "") + "-chain.txt")
    with open(path, "w") as f:
        f.write(chain_table(kernels, repeats))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-next-3b")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--token-map-size", type=int, metavar="N")
    ap.add_argument("--draft-head-fp8", action="store_true",
                    help="the draft chain through the FP8 draft head "
                         "(--speculative-draft-head-quantization fp8)")
    ap.add_argument("--json")
    ap.add_argument("--trace", metavar="DIR",
                    help="also write each graph's kernels by what they add to a replay "
                         "(DIR/<graph>-chain.txt)")
    a = ap.parse_args()
    token_map = first_ids_map(a.token_map_size, tempfile.mkdtemp()) if a.token_map_size else None
    eng, _ = build(a.shape, False, SpeculativeConfig(
        algorithm="nextn", num_steps=3, adaptive=False, token_map=token_map,
        draft_head_quantization="fp8" if a.draft_head_fp8 else None))
    small = torch.zeros(64, dtype=torch.int64, device="cuda")
    src = torch.ones_like(small)
    rows = {"copy_ of 64 int64": [host_us(lambda: small.copy_(src), a.repeats), None]}
    for label, graph in graphs_of(eng).items():
        rows[label] = [host_us(graph.replay, a.repeats), device_us(graph.replay, a.repeats)]
        print(f"{label:28} {rows[label][0]:8.1f} us host, {rows[label][1]:8.1f} us device "
              "per replay")
        if a.trace:
            os.makedirs(a.trace, exist_ok=True)
            trace_graph(graph, label, a.trace)
    print(f"{'copy_ of 64 int64':28} {rows['copy_ of 64 int64'][0]:8.1f} us host")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
