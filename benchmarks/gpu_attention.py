"""The paged attention kernel alone (kernels/paged_attention_triton.py) at the benchmark models'
head layouts, batch sizes and context lengths, under module switches (the variants below).

    python benchmarks/gpu_attention.py [--shapes 8b 1.7b 135m] [--batch 1 16 64]
        [--context 160 1024 4096] [--variants base pairs ...] [--json FILE]

Each case: ``batch`` sequences of ``context`` keys (each decoding one token) in a cache of
``max_model_len`` 4096 (256 blocks of 16, partitions of 128 keys: the engine's table width
and spread), K/V in bfloat16. Times are CUDA-graph replays of back-to-back calls (gpu_gemv's
``graph_time``), each on another copy of the caches (copies spanning >= 192 MB, past the 50 MB
L2), as each layer of a step reads its own. Prints microseconds per call per variant and
whether each variant's output has the bits of the variant it must match (the first with the
same NUM_WARPS); ``--json`` also records the K/V read rate (GB/s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from unittest import mock

import torch

from gpu_gemv import graph_time
from mtpserve.kernels import paged_attention_triton as pa
from mtpserve.kernels.paged_attention import partition_size

SHAPES = {"8b": (32, 8, 128), "1.7b": (16, 8, 128), "135m": (9, 3, 64)}   # (Hq, Hkv, D)
BLOCK = 16
MAX_MODEL_LEN = 4096
COLD_BYTES = 192 << 20
# name -> module switches. Session 25's run 1 (commit 807253b) also timed the old schedule of
# many tokens (a program ran its pair's partitions one after another and merged them after
# their max), with and without the online merge and the pair loop; that schedule is removed
# (BENCHMARKS.md). parallel: a pair's partitions always in parallel programs (at least two)
# and the merge kernel; pairs: the pair kernel at any batch; stages1 / stages3: the pair
# loop's software pipelining; w8: 8 warps
VARIANTS = {
    "base": {},
    "stages1": {"PAIR_STAGES": 1},
    "stages3": {"PAIR_STAGES": 3},
    "w8": {"NUM_WARPS": 8},
    "parallel": {"PAIR_KERNEL_PAIRS_PER_SM": 10 ** 9},
    "pairs": {"PAIR_KERNEL_PAIRS_PER_SM": 0},
}


def case(shape: str, batch: int, context: int, copies: int):
    """(q, [(k, v)] * copies, block tables, rows, lengths, part_size) for ``batch`` sequences
    of ``context`` keys, blocks shuffled over a cache of exactly their size."""
    hq, hkv, d = SHAPES[shape]
    g = torch.Generator().manual_seed(batch * 7919 + context)
    per = -(-context // BLOCK)
    blocks = batch * per
    width = MAX_MODEL_LEN // BLOCK
    tables = torch.zeros(batch, width, dtype=torch.int32)
    tables[:, :per] = torch.randperm(blocks, generator=g).to(torch.int32).view(batch, per)
    torch.cuda.manual_seed(batch * 7919 + context)
    caches = [(torch.randn(blocks * BLOCK, hkv, d, device="cuda", dtype=torch.bfloat16),
               torch.randn(blocks * BLOCK, hkv, d, device="cuda", dtype=torch.bfloat16))
              for _ in range(copies)]
    q = torch.randn(batch, hq, d, device="cuda", dtype=torch.bfloat16)
    rows = torch.arange(batch, dtype=torch.int32, device="cuda")
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    return q, caches, tables.to("cuda"), rows, lens, partition_size(MAX_MODEL_LEN, BLOCK)


def run_variant(switches: dict, q, caches, tables, rows, lens, part):
    """(microseconds per call, output of the first copy) with ``switches`` set on the module
    (restored after)."""
    d = q.shape[-1]

    def call(i):
        k, v = caches[i % len(caches)]
        return pa.paged_attention_triton(q, k, v, tables, rows, lens, d ** -0.5, BLOCK, part)

    with contextlib.ExitStack() as stack:   # (patch.multiple refuses no switches: "base")
        for name, value in switches.items():
            stack.enter_context(mock.patch.object(pa, name, value))
        out = call(0)
        us = graph_time(call, reps=max(20, len(caches)))
    return us, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["8b", "1.7b", "135m"], choices=SHAPES)
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--context", nargs="+", type=int, default=[160, 1024, 4096])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows_out = []
    for shape in args.shapes:
        _, hkv, d = SHAPES[shape]
        for batch in args.batch:
            for context in args.context:
                kv_bytes = 2 * batch * context * hkv * d * 2
                copies = max(1, -(-COLD_BYTES // kv_bytes))
                q, caches, tables, rows, lens, part = case(shape, batch, context, copies)
                ref = {}
                line = f"{shape:5} b{batch:<3} ctx {context:<5}"
                for name in args.variants:
                    us, out = run_variant(VARIANTS[name], q, caches, tables, rows, lens, part)
                    kind = VARIANTS[name].get("NUM_WARPS", pa.NUM_WARPS)
                    same = bool(torch.equal(out, ref.setdefault(kind, out)))
                    line += f" | {name} {us:7.2f}{'' if same else ' BITS DIFFER'}"
                    rows_out.append(dict(shape=shape, batch=batch, context=context,
                                         variant=name, us=us, kv_gb_s=kv_bytes / us / 1e3,
                                         bits_equal=same))
                print(line, flush=True)
                del caches
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()
