"""Skinny products (decode / verify) on the GPU: the Triton kernel of kernels/gemv_triton.py over a
grid of tile sizes against cuBLAS (torch.mm), for the weight shapes of the benchmark models.

    python benchmarks/gpu_gemv.py [--rows 1 4]

Prints, per (rows, N, K): cuBLAS microseconds, the best Triton configuration and its time, and the
bandwidth both reach (weight bytes / time). Times are CUDA-graph replays of 20 back-to-back calls,
so launch gaps are those of a captured decode step.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from mtpserve.kernels.gemv_triton import gemv

# (N, K) of qkv, o, gate_up, down for SmolLM2-135M, Qwen3-1.7B, Qwen3-8B and the 1.7B lm_head
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536),
          (4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144), (151936, 2048),
          (6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]
CONFIGS = (list(itertools.product((16, 32, 64), (128, 256, 512), (4,), (4,)))
           + [(32, 256, 8, 4), (64, 256, 8, 4), (16, 512, 4, 6)])


def graph_time(fn, reps: int = 20) -> float:
    """Microseconds per call, from a CUDA graph of ``reps`` calls (median of 5 replays)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return sorted(times)[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    a = ap.parse_args()
    for m, (n, k) in itertools.product(a.rows, SHAPES):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = x @ w.t()
        t_ref = graph_time(lambda: torch.mm(x, w.t()))
        best = None
        for bn, bk, warps, stages in CONFIGS:
            try:
                out = gemv(x, w, block_n=bn, block_k=bk, num_warps=warps, stages=stages)
            except Exception as e:  # a tile past the shared-memory limit
                print(f"  skip BN {bn} BK {bk} stages {stages}: {type(e).__name__}")
                continue
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            assert err < 1e-2, (bn, bk, warps, stages, err)
            t = graph_time(lambda: gemv(x, w, block_n=bn, block_k=bk, num_warps=warps,
                                        stages=stages))
            if best is None or t < best[0]:
                best = (t, bn, bk, warps, stages)
        gb = n * k * 2 / 1e9
        print(f"rows {m:2} N {n:6} K {k:5}: cuBLAS {t_ref:7.2f} us ({gb / t_ref * 1e6:5.0f} GB/s)"
              f"  triton {best[0]:7.2f} us ({gb / best[0] * 1e6:5.0f} GB/s) BN {best[1]} "
              f"BK {best[2]} warps {best[3]} stages {best[4]}", flush=True)


if __name__ == "__main__":
    main()
