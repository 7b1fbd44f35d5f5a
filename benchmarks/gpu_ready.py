"""Time-to-ready of ``mtpserve serve`` as a user sees it: a random-weight checkpoint of a shape
written to disk (config.json, tokenizer, bf16 safetensors; not timed), then the server started
in a fresh process and timed until /health answers 200 (imports, weight loading, profiling run,
Triton compiles, CUDA graph capture, warm-up). Each start gets its own Triton cache directory:
``--starts 2`` gives a fresh machine (empty cache) and then a restart (the same cache, warm).

    python benchmarks/gpu_ready.py --shape qwen3-1.7b [--starts 2] [--json out.json]
        [--log-dir DIR]   # each start's server log (timestamped lines: where the time goes)
        [--cprofile PATH]  # then the engine built in this process under cProfile (cache warm)
        [--checkpoint DIR]  # write the checkpoint there once; later runs reuse it (A/B runs)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from mtpserve.bench.random_model import checkpoint_shapes, random_model_files
from mtpserve.bench.server_proc import ServerProcess
from mtpserve.loader.safetensors_writer import write_safetensors


def write_checkpoint(shape: str, path: str) -> None:
    """config.json, the tokenizer and model.safetensors (bf16) of ``shape`` into ``path``."""
    files = random_model_files(shape, device="cuda" if torch.cuda.is_available() else "cpu")
    files.hf_config.dtype = "bfloat16"
    files.hf_config.save_pretrained(path)
    files.tokenizer.save_pretrained(path)
    specs = [(n, tuple(s), torch.bfloat16) for n, s in checkpoint_shapes(files.hf_config).items()]
    write_safetensors(os.path.join(path, "model.safetensors"), specs,
                      ((n, t.to(torch.bfloat16).cpu()) for n, t in files.iter_weights()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-1.7b")
    ap.add_argument("--starts", type=int, default=2)
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                    help="more server flags (e.g. --speculative-algorithm nextn)")
    ap.add_argument("--json")
    ap.add_argument("--log-dir", help="keep each start's server log here (start-N.log)")
    ap.add_argument("--cprofile", help="write the 60 costliest calls (cumulative) of building "
                                       "the engine in this process here")
    ap.add_argument("--checkpoint", help="the checkpoint's directory: written when it has no "
                                         "config.json, else reused")
    a = ap.parse_args()
    if a.log_dir:
        os.makedirs(a.log_dir, exist_ok=True)
    ckpt = a.checkpoint or tempfile.mkdtemp(prefix=f"ckpt-{a.shape}-")
    if not os.path.isfile(os.path.join(ckpt, "config.json")):
        os.makedirs(ckpt, exist_ok=True)
        t = time.perf_counter()
        write_checkpoint(a.shape, ckpt)
        print(f"{a.shape}: checkpoint written in {time.perf_counter() - t:.1f} s")
    cache = tempfile.mkdtemp(prefix="triton-")
    os.environ["TRITON_CACHE_DIR"] = cache      # inherited by the server process
    flags = ["--model", ckpt, "--dtype", "bfloat16", "--max-model-len", "4096",
             "--max-num-seqs", "64", *a.extra]
    ready = []
    for i in range(a.starts):
        t = time.perf_counter()
        log = os.path.join(a.log_dir, f"start-{i + 1}.log") if a.log_dir else None
        with ServerProcess(flags, ready_timeout_s=300, log_path=log):
            ready.append(time.perf_counter() - t)
        print(f"{a.shape}: start {i + 1} ({'empty' if i == 0 else 'warm'} Triton cache) ready "
              f"after {ready[-1]:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(shape=a.shape, flags=flags, ready_s=ready), f, indent=1)
    if a.cprofile:
        profile_engine(ckpt, a.cprofile)


def profile_engine(ckpt: str, path: str) -> None:
    """Build the engine over ``ckpt`` (as the server's flags above) and warm it up as the server
    does, under cProfile, with an empty Triton cache of its own (a fresh machine's start); write
    the 80 calls of most cumulative time to ``path``."""
    import cProfile
    import pstats

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-profiled-")
    from mtpserve import LLM

    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    llm = LLM(ckpt, dtype="bfloat16", max_model_len=4096, max_num_seqs=64)
    built = time.perf_counter() - t
    llm.engine.warmup()
    pr.disable()
    print(f"engine built in this process in {built:.1f} s, warmed up "
          f"{time.perf_counter() - t - built:.1f} s later (profiled, empty Triton cache)")
    with open(path, "w") as f:
        pstats.Stats(pr, stream=f).sort_stats("cumtime").print_stats(80)


if __name__ == "__main__":
    main()
