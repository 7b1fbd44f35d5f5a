"""The sort by expert of the fused MoE (kernels/fused_moe_triton.py) on the GPU: one Triton
program (``align_by_expert_triton``) against the PyTorch ops (``align_by_expert_torch``).

    python benchmarks/gpu_moe_align.py [--tokens 8 32 128 512 2048] [--sweep] [--json PATH]

For E=64 top 8 and E=512 top 10 (Qwen3-Next) and each token count, with routed random ids
(distinct experts per token): microseconds of device time per call (20 calls captured in a CUDA
graph, median of 5 replays) and of wall time per eager call (200 calls back to back, one sync at
the end: what a host-bound prefill pays). ``--sweep``: the kernel's chunk, counting chunk and warps.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

from gpu_gemv import graph_time
from mtpserve.kernels import fused_moe_triton as fm

SHAPES = ((64, 8), (512, 10))
CALLS = 20


def eager_us(fn, reps: int = 200) -> float:
    """Wall microseconds per eager call, ``reps`` calls then one sync (after a warm-up)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def ids_of(T: int, k: int, E: int) -> torch.Tensor:
    return torch.rand(T, E, device="cuda").topk(k, dim=1).indices


def compare(tokens) -> dict:
    out = {}
    for (E, k), T in itertools.product(SHAPES, tokens):
        ids, bm = ids_of(T, k, E), fm._block_m(T * k)
        a, b = fm.align_by_expert_triton(ids, E, bm), fm.align_by_expert_torch(ids, E, bm)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), (E, k, T)
        r = {"kernel_graph_us": graph_time(lambda i: fm.align_by_expert_triton(ids, E, bm), CALLS),
             "torch_graph_us": graph_time(lambda i: fm.align_by_expert_torch(ids, E, bm), CALLS),
             "kernel_eager_us": eager_us(lambda: fm.align_by_expert_triton(ids, E, bm)),
             "torch_eager_us": eager_us(lambda: fm.align_by_expert_torch(ids, E, bm))}
        out[f"E={E} k={k} T={T} n={T * k}"] = r
        print(f"E={E:3d} k={k:2d} T={T:5d} n={T * k:6d} bm={bm}: kernel "
              f"{r['kernel_graph_us']:7.1f} us graph {r['kernel_eager_us']:7.1f} us eager; torch "
              f"{r['torch_graph_us']:7.1f} us graph {r['torch_eager_us']:7.1f} us eager",
              flush=True)
    return out


def sweep(tokens) -> dict:
    out = {}
    saved = fm.ALIGN_WARPS
    for (E, k), T in itertools.product(SHAPES, tokens):
        ids, bm = ids_of(T, k, E), fm._block_m(T * k)
        rows = []
        for chunk, count, warps in itertools.product((64, 128, 256), (512, 1024, 2048),
                                                     (4, 8)):
            fm.ALIGN_WARPS = warps
            us = graph_time(lambda i: fm.align_by_expert_triton(ids, E, bm, chunk, count), CALLS)
            rows.append((us, chunk, count, warps))
        fm.ALIGN_WARPS = saved
        rows.sort()
        print(f"E={E} k={k} T={T}: best (us, chunk, count chunk, warps) {rows[:4]}; "
              f"worst {rows[-1]}", flush=True)
        out[f"E={E} k={k} T={T}"] = rows
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 32, 128, 512, 2048])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.manual_seed(0)
    res = {"compare": compare(a.tokens)}
    if a.sweep:
        res["sweep"] = sweep([128, 2048])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
