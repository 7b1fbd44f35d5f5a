"""Engine build time with a start-up switch on and off, each build a fresh process with an empty
Triton cache of its own (a fresh machine's start), the variants taking turns on one machine
(their order reversed every other repeat).

    python benchmarks/gpu_build_ab.py --checkpoint DIR [--repeats 3]
        --switch LABEL=MODULE:ATTR:VALUE ...   # e.g. no_pdl=mtpserve.kernels.pdl:ENABLED:false
        --tree LABEL=SRC_DIR ...               # another copy of src/ (an older commit's)

Prints the seconds from ``LLM(...)`` called to returned (the engine built: weights, profiling,
compiles, graph capture; not the imports) per variant and repeat, and each variant's median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import importlib, json, os, sys, time
for spec in json.loads(sys.argv[2]):
    mod, attr, value = spec.split(":")
    setattr(importlib.import_module(mod), attr, json.loads(value))
from mtpserve import LLM
t = time.perf_counter()
LLM(sys.argv[1], dtype="bfloat16", max_model_len=4096, max_num_seqs=64)
print(json.dumps(time.perf_counter() - t))
"""


def build_seconds(ckpt: str, switches: list[str], src: str | None = None) -> float:
    """Seconds to build the engine in a fresh process with an empty Triton cache, with the
    module switches set, importing mtpserve from ``src`` when given."""
    env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton-ab-")}
    if src:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(src), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", CHILD, ckpt, json.dumps(switches)], env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tree", nargs="+", default=[],
                    help="LABEL=SRC_DIR: a variant importing mtpserve from SRC_DIR (a copy of "
                         "another commit's src/) instead of the tree's")
    ap.add_argument("--switch", nargs="+", default=[],
                    help="LABEL=MODULE:ATTR:VALUE (VALUE in JSON), each a variant built beside "
                         "the tree as it is ('default'); the two start-up switches this was "
                         "written for lost and are gone (BENCHMARKS.md, session 18)")
    ap.add_argument("--json")
    a = ap.parse_args()
    variants = {"default": ([], None)}
    for item in a.switch:
        label, _, spec = item.partition("=")
        variants[label] = ([spec], None)
    for item in a.tree:
        label, _, src = item.partition("=")
        variants[label] = ([], src)
    if len(variants) < 2:
        ap.error("give at least one --switch or --tree")
    times = {label: [] for label in variants}
    for r in range(a.repeats):   # turns reversed every other repeat (ABBA): in session 18 the
        # variant built first in every repeat was the slowest twice, by 1-4 s
        order = list(variants.items())
        for label, (specs, src) in (order if r % 2 == 0 else order[::-1]):
            times[label].append(build_seconds(a.checkpoint, specs, src))
            print(f"repeat {r + 1} {label:18} built in {times[label][-1]:.2f} s", flush=True)
    for label, ts in times.items():
        print(f"{label:18} median {statistics.median(ts):.2f} s of {len(ts)}: "
              + " ".join(f"{t:.2f}" for t in ts))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(times, f, indent=1)


if __name__ == "__main__":
    main()
