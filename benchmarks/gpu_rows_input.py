"""Products of a few rows with their input computed in front (kernels/gemv_rows_input.py) on the
GPU, against the same product after the input's own kernel, for the weight shapes of the
benchmark models.

    python benchmarks/gpu_rows_input.py [--rows 4] [--shapes 135m 1.7b 8b] [--json FILE]

Per (rows, N, K) and input (``silu``: [M, 2K] gate | up, for the down shapes; ``norm``: a
residual add + RMSNorm of a bfloat16 tensor; ``norm4``: the same of 4 split-K float32
partials), microseconds per call of: the input's kernel then the plain product (``apart``),
the fused product in gemv's tiles (``fused``), the same without PDL (``nopdl``), and the fused
product at other steps of the reduction and pipeline depths (``bk<B>s<S>``); ``plain``: the
product alone. Times are CUDA-graph replays of 20 calls, each
on another copy of the weight past the L2 (gpu_gemv.graph_time), with PDL as in a step.
"""

from __future__ import annotations

import argparse
import json

import torch

from gpu_gemv import COLD_BYTES, SHAPES, graph_time
from mtpserve.kernels import gemv_triton, pdl
from mtpserve.kernels.fused_triton import add_rms_norm, silu_and_mul
from mtpserve.kernels.gemv_stream_triton import NormInput
from mtpserve.kernels.gemv_triton import SplitKPartials, gemv, tile_config

VARIANTS = ((64, 2), (64, 4), (128, 2), (128, 4), (256, 4))


def inputs(kind: str, m: int, k: int):
    """(the fused product's input maker i -> input, the apart path's input kernel i -> x,
    gemv keywords of the fused product)."""
    dev, bf = "cuda", torch.bfloat16
    if kind == "silu":
        gu = torch.randn(m, 2 * k, device=dev, dtype=bf)
        return (lambda: gu), (lambda: silu_and_mul(gu)), dict(silu_input=True)
    res = torch.randn(m, k, device=dev, dtype=bf)
    nw = torch.rand(k, device=dev, dtype=bf) + 0.5
    out = torch.empty_like(res)
    x = (SplitKPartials(torch.randn(4, m, k, device=dev), bf) if kind == "norm4" else
         torch.randn(m, k, device=dev, dtype=bf))
    return ((lambda: NormInput(x, res, nw, 1e-6, out)),
            (lambda: add_rms_norm(x, res, nw, 1e-6, False)[0]), {})


def measure(m: int, n: int, k: int, kind: str) -> dict:
    copies = max(1, -(-COLD_BYTES // (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    fused_in, apart_in, kw = inputs(kind, m, k)
    row = {"rows": m, "n": n, "k": k, "input": kind, "tiles": tile_config(n, k, m)}
    row["plain_us"] = graph_time(lambda i: gemv(_plain_x(m, k), ws[i % copies]))
    row["apart_us"] = graph_time(lambda i: gemv(apart_in(), ws[i % copies]))
    row["fused_us"] = graph_time(lambda i: gemv(fused_in(), ws[i % copies], **kw))
    base = {a: b for a, b in row["tiles"].items() if a not in ("preload", "block_k", "stages")}
    pdl.ENABLED = False
    try:
        row["nopdl_us"] = graph_time(lambda i: gemv(fused_in(), ws[i % copies], **kw))
    finally:
        pdl.ENABLED = True
    for bk, stages in VARIANTS:
        row[f"bk{bk}s{stages}_us"] = graph_time(
            lambda i: gemv(fused_in(), ws[i % copies], **base, block_k=bk, stages=stages, **kw))
    return row


_X = {}


def _plain_x(m: int, k: int) -> torch.Tensor:
    if (m, k) not in _X:
        _X[(m, k)] = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    return _X[(m, k)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[4])
    ap.add_argument("--shapes", nargs="+", default=["135m", "1.7b", "8b"], choices=list(SHAPES))
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    cols = ["plain", "apart", "fused", "nopdl"] + [f"bk{b}s{s}" for b, s in VARIANTS]
    print(f"{'rows':>4} {'N x K':>12} {'input':>6} " + " ".join(f"{c:>9}" for c in cols))
    for m in a.rows:
        for shape in a.shapes:
            qkv, _, gate_up, down = SHAPES[shape][:4]
            for (n, k), kind in ((qkv, "norm"), (qkv, "norm4"), (gate_up, "norm"),
                                 (gate_up, "norm4"), (down, "silu")):
                if tile_config(n, k, m)["split_k"] > 1 and kind != "silu":
                    continue
                r = measure(m, n, k, kind)
                rows.append(r)
                print(f"{m:4} {f'{n}x{k}':>12} {kind:>6} "
                      + " ".join(f"{r[c + '_us']:9.2f}" for c in cols), flush=True)
    print(f"gemv_triton.FUSED_INPUT_BLOCK_K = {gemv_triton.FUSED_INPUT_BLOCK_K}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
