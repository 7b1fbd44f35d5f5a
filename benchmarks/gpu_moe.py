"""Tile sizes of the fused MoE expert kernels (kernels/fused_moe_triton.py) on the GPU.

    python benchmarks/gpu_moe.py [--tokens 1 4 16 64] [--small] [--stages 2 3 4] [--json PATH]

For the Qwen3-Next-like shape of gpu_decode.py (64 experts, top 8, hidden 2048, expert width
512, bf16) and each token count: microseconds per ``fused_experts`` call (20 calls captured in a
CUDA graph, median of 5 replays) for a sweep of ``MoETiles``, with the expert bytes it reads
(distinct experts x 3 x H x I x 2 B) as TB/s. Random routing, distinct experts per token.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton

from gpu_gemv import graph_time
from mtpserve.kernels.fused_moe_triton import MoETiles, fused_experts, moe_tiles

E, K, H, I = 64, 8, 2048, 512
CALLS = 20


def sweep(small: bool = False, stages=(None,)):
    """The tiles timed: 108, or with ``small`` 24 around moe_tiles' choices (4 warps), each at
    every pipeline depth of ``stages`` (None: Triton's default)."""
    if small:
        grid = ((16, 32, 64), (64, 256), (64, 128), (64, 128), (4,), stages)
    else:
        grid = ((16, 32, 64), (64, 128, 256), (32, 64, 128), (64, 128), (2, 4), stages)
    for gn, gk, dn, dk, w, st in itertools.product(*grid):
        yield MoETiles(gn, gk, dn, dk, w, st)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--json")
    ap.add_argument("--small", action="store_true", help="24 tiles instead of 108")
    ap.add_argument("--stages", type=int, nargs="+", default=None,
                    help="pipeline depths to sweep (default: Triton's)")
    a = ap.parse_args()
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    gate_up = torch.randn(E, 2 * I, H, device=dev, dtype=dt) * 0.02
    down = torch.randn(E, H, I, device=dev, dtype=dt) * 0.02
    results = {}
    for T in a.tokens:
        x = torch.randn(T, H, device=dev, dtype=dt)
        ids = torch.rand(T, E, device=dev).topk(K, dim=1).indices
        w = torch.rand(T, K, device=dev, dtype=dt)
        gb = ids.unique().numel() * 3 * H * I * 2 / 1e9
        ref = fused_experts(x, ids, w, gate_up, down, MoETiles())
        chosen = moe_tiles(T * K)
        rows = []
        for t in sweep(a.small, tuple(dict.fromkeys((None, *(a.stages or ()))))):
            try:
                out = fused_experts(x, ids, w, gate_up, down, t)
            except triton.runtime.errors.OutOfResources:   # tiles too large for shared memory
                continue
            assert (out - ref).abs().max().item() < 1e-2 * ref.abs().max().item() + 1e-3
            us = graph_time(lambda i: fused_experts(x, ids, w, gate_up, down, t), CALLS)
            rows.append((us, t))
        rows.sort(key=lambda r: r[0])
        base = next((us for us, t in rows if t == MoETiles()), float("nan"))
        ours = next((us for us, t in rows if t == chosen), float("nan"))
        print(f"T={T}: {gb * 1e3:.0f} MB of experts; 64x64 tiles {base:.1f} us "
              f"({gb / base * 1e3:.2f} TB/s); moe_tiles {ours:.1f} us; best:", flush=True)
        for us, t in rows[:5]:
            print(f"  {us:6.1f} us ({gb / us * 1e3:.2f} TB/s) {t}", flush=True)
        results[T] = {"tiles_64_us": base, "moe_tiles_us": ours, "best": [(us, t.__dict__) for us, t in rows[:10]]}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
