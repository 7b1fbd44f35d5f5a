"""One batch-1 SwiGLU MLP on the GPU: the separate kernels the models run against the persistent
kernel of kernels/mlp_triton.py in its variants.

    python benchmarks/gpu_mlp.py [--shapes 1.7b 8b] [--rows 1] [--json FILE]

Per shape (K, I, N) and variant, microseconds per MLP: CUDA-graph replays of 20 back-to-back
calls (gpu_gemv.graph_time), each on another copy of the weights (copies spanning >= 192 MB,
past the 50 MB L2), so that every call reads its weights from HBM as in a decode step. Variants:
``separate`` (gate/up product, SiLU-and-mul, down product with its partials left to the next
norm: the model's path where the epilogue does not pay), ``epilogue`` (the gate/up product with
its SwiGLU epilogue, then the down product), and the persistent kernel: ``one_round``,
``one_round_prefetch``, ``split_launch`` (its two phases as two launches under PDL, no
barrier), ``rounds_2`` / ``rounds_3`` (2 / 3 programs a SM, several tiles each). Prints the
plan each persistent variant ran and its compiled registers and shared memory.
"""

from __future__ import annotations

import argparse
import json

import torch

from gpu_gemv import COLD_BYTES, graph_time
from mtpserve.kernels import gemv_triton, mlp_triton
from mtpserve.kernels.fused_triton import silu_and_mul
from mtpserve.layers.activation import interleave_gate_up

SHAPES = {"135m": (576, 1536, 576), "1.7b": (2048, 6144, 2048), "8b": (4096, 12288, 4096)}
# variant -> mlp_triton constants it sets (the persistent ones)
PERSISTENT = {
    "one_round": {},
    "one_round_prefetch": {"PREFETCH": 2},
    "split_launch": {"SPLIT_LAUNCH": True},
    "rounds_2": {"ONE_ROUND": False, "PROGRAMS_PER_SM": 2},
    "rounds_3": {"ONE_ROUND": False, "PROGRAMS_PER_SM": 3},
}


def weights(k: int, i: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Copies of (gate/up in checkpoint order, the same interleaved, down), bf16 on CUDA,
    spanning at least COLD_BYTES."""
    g = torch.Generator(device="cuda").manual_seed(0)
    copies = max(1, -(-COLD_BYTES // (3 * i * k * 2 + n * i * 2)))
    out = []
    for _ in range(copies):
        gu = torch.randn(2 * i, k, device="cuda", generator=g).bfloat16() * k ** -0.5
        out.append((gu, interleave_gate_up(gu), torch.randn(n, i, device="cuda", generator=g)
                    .bfloat16() * i ** -0.5))
    return out


def time_variants(shape: str, rows: int) -> dict:
    """Microseconds per MLP of each variant for one shape (see the module doc)."""
    k, i, n = SHAPES[shape]
    ws = weights(k, i, n)
    x = torch.randn(rows, k, device="cuda").bfloat16()
    gemv = gemv_triton.gemv
    res = {
        "separate": graph_time(lambda j: gemv(silu_and_mul(gemv(x, ws[j % len(ws)][0])),
                                              ws[j % len(ws)][2], defer_sum=True)),
        "epilogue": graph_time(lambda j: gemv(gemv(x, ws[j % len(ws)][1], swiglu=True),
                                              ws[j % len(ws)][2], defer_sum=True)),
    }
    for name, consts in PERSISTENT.items():
        saved = {c: getattr(mlp_triton, c) for c in consts}
        for c, v in consts.items():
            setattr(mlp_triton, c, v)
        try:
            res[name] = graph_time(lambda j: mlp_triton.swiglu_mlp(x, *ws[j % len(ws)][1:]))
            progs, cfg, stages = mlp_triton.last_plan[(2 * i, k, n)]
            res[f"{name}_plan"] = dict(programs=progs, stages=stages, **cfg)
        finally:
            for c, v in saved.items():
                setattr(mlp_triton, c, v)
    for key, known in mlp_triton._resident_known.items():
        res.setdefault("resident", []).append([str(key[1:2]), known])
    return res


def compiled_resources() -> list[str]:
    """Registers, spills and shared memory of every compiled persistent kernel."""
    out = []
    try:   # Triton's private cache layout: (kernels by key, ...) per device
        for cache in mlp_triton._swiglu_mlp_kernel.device_caches.values():
            for kernel in cache[0].values():
                kernel._init_handles()
                c = kernel.metadata
                out.append(f"regs {kernel.n_regs} spills {kernel.n_spills} shared {c.shared} "
                           f"warps {c.num_warps} stages {getattr(c, 'num_stages', '?')}")
    except (AttributeError, TypeError, IndexError) as e:
        out.append(f"(not read: {e!r})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["1.7b", "8b"], choices=list(SHAPES))
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    gemv_triton.DEFER_SUM = True
    out = {}
    for shape in a.shapes:
        res = out[shape] = time_variants(shape, a.rows)
        times = "  ".join(f"{v}: {res[v]:.2f}" for v in ["separate", "epilogue", *PERSISTENT])
        print(f"{shape} rows {a.rows} (us per MLP)  {times}")
        for v in PERSISTENT:
            print(f"  {v}: {res[f'{v}_plan']}")
    for line in compiled_resources():
        print("  compiled:", line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
