"""Skinny products (decode / verify) on the GPU: the Triton kernel of kernels/gemv_triton.py over a
grid of tile sizes and split-K factors against cuBLAS (torch.mm), for the weight shapes of the
benchmark models.

    python benchmarks/gpu_gemv.py [--rows 1 4] [--shapes 1.7b 8b] [--json FILE]

Prints, per (rows, N, K): cuBLAS microseconds, the current default tile (``tile_config``), the
best configuration of the grid and its time, and the bandwidth each reaches (weight bytes /
time). Times are CUDA-graph replays of 20 back-to-back calls, each call on another copy of the
weight (copies spanning >= 192 MB, past the 50 MB L2), so every call reads its weight from HBM,
as in a decode step; launch gaps are those of a captured step.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from mtpserve.kernels.gemv_triton import gemv, tile_config

# (N, K) of qkv, o, gate_up, down (and the lm_head) per model
SHAPES = {
    "135m": [(960, 576), (576, 576), (3072, 576), (576, 1536)],
    "1.7b": [(4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144), (151936, 2048)],
    "8b": [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096)],
}
# (block_n, block_k, num_warps, stages, split_k)
CONFIGS = ([c + (1,) for c in itertools.product((16, 32, 64), (128, 256, 512), (4,), (4,))]
           + [c + (s,) for s in (2, 4, 8) for c in itertools.product((16, 32), (128, 256), (4,),
                                                                     (4,))]
           + [(32, 256, 8, 4, 1), (64, 256, 8, 4, 1), (16, 512, 4, 6, 1), (32, 128, 4, 6, 2)])
COLD_BYTES = 192 << 20


def graph_time(fn, reps: int = 20) -> float:
    """Microseconds per call, from a CUDA graph of ``reps`` calls ``fn(i)`` (median of 5)."""
    for i in range(2):
        fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(i)
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return sorted(times)[2]


def sweep(m: int, n: int, k: int) -> dict:
    """cuBLAS, the default tile and the best grid configuration for rows m of an [n, k] weight."""
    copies = max(1, -(-COLD_BYTES // (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = (x.float() @ ws[0].float().t())
    res = {"rows": m, "n": n, "k": k, "gb": n * k * 2 / 1e9,
           "cublas_us": graph_time(lambda i: torch.mm(x, ws[i % copies].t())),
           "default": tile_config(n, k)}
    res["default_us"] = graph_time(lambda i: gemv(x, ws[i % copies]))
    best = None
    for bn, bk, warps, stages, split in CONFIGS:
        if split > 1 and k // split < bk:
            continue
        kw = dict(block_n=bn, block_k=bk, num_warps=warps, stages=stages, split_k=split)
        try:
            out = gemv(x, ws[0], **kw)
        except Exception as e:  # a tile past the shared-memory limit
            print(f"  skip {kw}: {type(e).__name__}")
            continue
        err = ((out.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (kw, err)
        t = graph_time(lambda i: gemv(x, ws[i % copies], **kw))
        if best is None or t < best[0]:
            best = (t, kw)
    res["best_us"], res["best"] = best
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--shapes", nargs="+", default=["1.7b", "8b"], choices=list(SHAPES))
    ap.add_argument("--json")
    a = ap.parse_args()
    results = []
    for m, name in itertools.product(a.rows, a.shapes):
        for n, k in SHAPES[name]:
            r = sweep(m, n, k)
            results.append(r)
            bw = lambda us: r["gb"] / us * 1e6  # noqa: E731  GB/s
            dflt = f"default {r['default_us']:7.2f} us ({bw(r['default_us']):5.0f} GB/s)"
            print(f"rows {m:2} N {n:6} K {k:5}: cuBLAS {r['cublas_us']:7.2f} us "
                  f"({bw(r['cublas_us']):5.0f} GB/s)  {dflt}  best {r['best_us']:7.2f} us "
                  f"({bw(r['best_us']):5.0f} GB/s) {r['best']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
