"""Whether CUDA's start-up overlaps the engine's other start-up work in one process.

An engine start on the H200 spent ~2-3 s between its imports and its weights (session 18):
creating the CUDA context and reading the tokenizer. Each case runs in a fresh process:
``serial`` imports the engine code, reads the tokenizer of ``--model``, then makes the CUDA
context (a 1-element tensor); ``overlap`` makes the context in a thread started right after
``import torch``, while the main thread does the rest. Prints seconds per phase and in all.

    python benchmarks/gpu_init_overlap.py --model CHECKPOINT_DIR [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, threading, time
t0 = time.perf_counter()
import torch
t_torch = time.perf_counter()
ctx = {}
def make_context():
    s = time.perf_counter()
    torch.zeros(1, device="cuda")
    ctx["s"] = time.perf_counter() - s
th = threading.Thread(target=make_context) if sys.argv[2] == "overlap" else None
if th:
    th.start()
import mtpserve.engine.engine  # noqa: F401
from mtpserve.loader.tokenizer import load_tokenizer
t_imp = time.perf_counter()
load_tokenizer(sys.argv[1])
t_tok = time.perf_counter()
if th:
    th.join()
else:
    make_context()
t_end = time.perf_counter()
print(json.dumps(dict(torch=t_torch - t0, engine_imports=t_imp - t_torch, tokenizer=t_tok - t_imp,
                      context=ctx["s"], after_tokenizer=t_end - t_tok, total=t_end - t0)))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    for _ in range(a.repeats):
        for case in ("serial", "overlap"):
            out = subprocess.run([sys.executable, "-c", CHILD, a.model, case], check=True,
                                 capture_output=True, text=True).stdout.strip().splitlines()[-1]
            row = json.loads(out)
            print(f"{case:8} " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
