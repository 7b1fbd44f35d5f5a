"""Skinny products (decode / verify) on the GPU: the Triton kernel of kernels/gemv_triton.py over a
grid of tile sizes and split-K factors against cuBLAS (torch.mm), for the weight shapes of the
benchmark models.

    python benchmarks/gpu_gemv.py [--rows 1 4] [--shapes 1.7b 8b] [--only NxK ...]
        [--grid default|wide] [--json FILE]

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

from mtpserve.kernels.gemv_stream_triton import gemv_stream, sm_count
from mtpserve.kernels.gemv_triton import gemv, register_share, tile_config

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
# --grid wide: more warps, pipeline depths and splits, and 128-row tiles (session 19)
WIDE = sorted(set(
    [c + (4, 1) for c in itertools.product((16, 32, 64, 128), (64, 128, 256, 512), (4, 8))
     if c[0] * c[1] <= 32768]
    + [(bn, bk, w, st, 1) for bn, bk in ((32, 128), (32, 256), (64, 128), (64, 64))
       for w in (4, 8) for st in (2, 3, 6)]
    + [(bn, bk, w, 4, sp) for bn in (16, 32, 64) for bk in (64, 128, 256) for w in (4, 8)
       for sp in (2, 3, 4)]))
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


def _too_split(k: int, block_k: int, split: int) -> bool:
    """Whether a split leaves each program less than one reduction tile (configuration skipped)."""
    return split > 1 and k // split < block_k


def sweep(m: int, n: int, k: int, configs=CONFIGS, streams=()) -> dict:
    """cuBLAS, the default tile and the best grid configuration for rows m of an [n, k] weight
    (``streams``: also these (block_n, block_k, warps, programs per SM) of the streamed one-row
    product, kernels/gemv_stream_triton.py, at one row, each program held to its share of the
    SM's registers as gemv_triton streams them). ``tiles_us``: the default tiles
    (``tile_config``), also where ``gemv`` streams by default."""
    copies = max(1, -(-COLD_BYTES // (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = (x.float() @ ws[0].float().t())
    res = {"rows": m, "n": n, "k": k, "gb": n * k * 2 / 1e9,
           "cublas_us": graph_time(lambda i: torch.mm(x, ws[i % copies].t())),
           "default": tile_config(n, k, m)}
    res["default_us"] = graph_time(lambda i: gemv(x, ws[i % copies]))
    tiles = {a: b for a, b in res["default"].items() if a != "preload"}   # tiles, not streamed
    res["tiles_us"] = graph_time(lambda i: gemv(x, ws[i % copies], **tiles,
                                                preload=res["default"]["preload"]))
    best, res["all"] = None, []
    for bn, bk, warps, stages, split, *preload in configs:
        if _too_split(k, bk, split):
            continue
        kw = dict(block_n=bn, block_k=bk, num_warps=warps, stages=stages, split_k=split)
        if preload and preload[0]:   # a preloaded tile: the reduction in tiles of bk
            kw.update(split_k=-(-k // bk), preload=preload[0])
        try:
            out = gemv(x, ws[0], **kw)
        except Exception as e:  # a tile past the shared-memory limit
            print(f"  skip {kw}: {type(e).__name__}")
            continue
        err = ((out.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (kw, err)
        t = graph_time(lambda i: gemv(x, ws[i % copies], **kw))
        res["all"].append([bn, bk, warps, stages, kw["split_k"], *preload, round(t, 3)])
        if best is None or t < best[0]:
            best = (t, kw)
    if m == 1:
        for bn, bk, warps, per_sm in streams:
            if k % bk:
                continue
            kw = dict(block_n=bn, block_k=bk, num_warps=warps, programs=per_sm * sm_count(0),
                      maxnreg=register_share(per_sm, warps))
            out = gemv_stream(x, ws[0], **kw)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (kw, err)
            t = graph_time(lambda i: gemv_stream(x, ws[i % copies], **kw))
            res["all"].append(["stream", bn, bk, warps, per_sm, round(t, 3)])
            if best is None or t < best[0]:
                best = (t, dict(kw, stream=True))
    res["best_us"], res["best"] = best or (float("nan"), None)
    return res


def _compile_one(job) -> str:
    """Compile (and launch once) one configuration in a worker process, for the shared Triton
    cache; returns an error name or ''."""
    m, n, k, (bn, bk, warps, stages, split, *_) = job
    if _too_split(k, bk, split):
        return ""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    try:
        gemv(x, w, block_n=bn, block_k=bk, num_warps=warps, stages=stages, split_k=split)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001  reported by the timing pass
        return type(e).__name__
    return ""


def precompile(jobs: list, workers: int) -> None:
    """Compile every (rows, N, K, config) job in ``workers`` processes first: Triton compiles
    on the CPU, one kernel at a time per process, and the timing pass then loads each from the
    cache instead of compiling ~100 kernels per shape in turn."""
    import multiprocessing as mp
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(_compile_one, jobs, chunksize=4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--shapes", nargs="+", default=["1.7b", "8b"], choices=list(SHAPES))
    ap.add_argument("--only", nargs="+", default=None, metavar="NxK",
                    help="only these weight shapes, e.g. 24576x4096")
    ap.add_argument("--grid", choices=["default", "wide", "none"], default="default")
    ap.add_argument("--preload", nargs="+", default=[], metavar="BN,BK,WARPS,MODE",
                    help="also these preloaded tiles (gemv(preload=MODE), the reduction split "
                         "into tiles of BK)")
    ap.add_argument("--stream", nargs="+", default=[], metavar="BN,BK,WARPS,PER_SM",
                    help="also the streamed one-row product (gemv_stream) with these units, "
                         "warps and programs per SM")
    ap.add_argument("--precompile", type=int, default=0, metavar="PROCS",
                    help="compile all configurations in this many processes first")
    ap.add_argument("--json")
    a = ap.parse_args()
    grid = {"wide": WIDE, "default": CONFIGS, "none": []}[a.grid]
    grid = grid + [(bn, bk, w, 1, 1, mode) for bn, bk, w, mode in
                   (map(int, spec.split(",")) for spec in a.preload)]
    picked = [(m, n, k) for m, name in itertools.product(a.rows, a.shapes)
              for n, k in SHAPES[name] if not a.only or f"{n}x{k}" in a.only]
    if a.precompile:
        precompile([(m, n, k, c) for m, n, k in picked for c in grid], a.precompile)
    results = []
    for m, n, k in picked:
        r = sweep(m, n, k, grid, [tuple(map(int, spec.split(","))) for spec in a.stream])
        results.append(r)
        if a.json:   # after each shape, so a run cut short keeps what it measured
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
        bw = lambda us: r["gb"] / us * 1e6  # noqa: E731  GB/s
        dflt = (f"default {r['default_us']:7.2f} us ({bw(r['default_us']):5.0f} GB/s), "
                f"tiles {r['tiles_us']:7.2f}")
        print(f"rows {m:2} N {n:6} K {k:5}: cuBLAS {r['cublas_us']:7.2f} us "
              f"({bw(r['cublas_us']):5.0f} GB/s)  {dflt}  best {r['best_us']:7.2f} us "
              f"({bw(r['best_us']):5.0f} GB/s) {r['best']}", flush=True)
        if a.grid == "none":   # a few configurations: each one's time
            for row in r["all"]:
                print(f"    {row[:-1]}: {row[-1]:7.2f} us ({bw(row[-1]):5.0f} GB/s)")


if __name__ == "__main__":
    main()
