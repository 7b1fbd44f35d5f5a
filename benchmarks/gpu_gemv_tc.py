"""The Gluon tensor-core stream (kernels/gemv_tc_gluon.py) against the tree's products of 4 rows.

For each weight of the 135M and 1.7B shapes: checks the product of 1, 2, 4, 8 and 16 rows
against a float32 reference (relative error < 1e-2) and that a row's bits do not depend on the
rows beside it (rows of 2 equal to the first two of 4, of 8), then times, in CUDA graphs of 20
back-to-back calls each on a cold copy of the weight (benchmarks/gpu_gemv.py's ``graph_time``),
the tree's ``gemv`` at 4 rows (tiles) and at 1 row (preloaded or streamed), and a grid of
(block_k, stages, warps, accumulators) of ``gemv_tc`` at 4 rows.

    python benchmarks/gpu_gemv_tc.py [--shapes 135m 1.7b] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from gpu_gemv import COLD_BYTES, SHAPES, graph_time
from mtpserve.kernels.gemv_tc_gluon import gemv_tc
from mtpserve.kernels.gemv_triton import gemv

GRID = [dict(block_k=bk, stages=st, num_warps=w, nacc=2)
        for bk, st, w in itertools.product((64, 128, 256, 512), (2, 3, 4, 6, 8), (1, 2, 4))
        if st * (16 * w + 8) * bk * 2 <= 200 << 10]


def check(n: int, k: int) -> float:
    """Worst relative error of gemv_tc over 1-16 rows of an [n, k] weight; asserts row
    independence of the bits."""
    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = torch.randn(n, k, device="cuda", generator=g).bfloat16() * 0.05
    x = torch.randn(16, k, device="cuda", generator=g).bfloat16()
    ref = x.float() @ w.float().t()
    worst = 0.0
    bk = 128
    for m in (1, 2, 4, 8, 16):
        y = gemv_tc(x[:m], w, block_k=bk)
        worst = max(worst, ((y.float() - ref[:m]).norm() / ref[:m].norm()).item())
    y4, y8 = gemv_tc(x[:4], w, block_k=bk), gemv_tc(x[:8], w, block_k=bk)
    assert torch.equal(gemv_tc(x[:2], w, block_k=bk), y4[:2]), (n, k)
    assert torch.equal(y8[:4], y4), (n, k)
    assert worst < 1e-2, (n, k, worst)
    return worst


def time_shape(n: int, k: int) -> dict:
    copies = max(1, -(-COLD_BYTES // (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
    res = {"n": n, "k": k, "err": check(n, k),
           "tiles4_us": graph_time(lambda i: gemv(x, ws[i % copies])),
           "one_row_us": graph_time(lambda i: gemv(x[:1], ws[i % copies])), "tc": []}
    for kw in GRID:
        if kw["block_k"] > 2 * k:
            continue
        t = graph_time(lambda i: gemv_tc(x, ws[i % copies], **kw))
        res["tc"].append(dict(kw, us=round(t, 3)))
    best = min(res["tc"], key=lambda r: r["us"])
    print(f"{n}x{k}: tiles(4) {res['tiles4_us']:.2f} us, one row {res['one_row_us']:.2f}, "
          f"tc best {best['us']:.2f} ({best}), err {res['err']:.1e}", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["135m", "1.7b"])
    ap.add_argument("--json")
    a = ap.parse_args()
    out = []
    for shape in a.shapes:
        for n, k in SHAPES[shape][:4]:
            out.append(dict(time_shape(n, k), shape=shape))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
