"""Where time-to-ready goes: one engine built (CUDA graphs on) and warmed up, with every Triton
compile timed and the start-up phases timed. Run it twice with the same ``--triton-cache`` to see
a fresh machine (empty cache) against a restart (warm cache).

    python benchmarks/gpu_startup.py --shape qwen3-1.7b --triton-cache /tmp/tc [--json out.json]
        [--cprofile out.txt]

The shapes' random weights are made on the GPU and their word-level tokenizer (151,936 words)
is built in the process (~4 s, inside ``build_s``): a real model's start reads weights from
disk and a tokenizer file instead.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-1.7b")
    ap.add_argument("--triton-cache", required=True, help="TRITON_CACHE_DIR for this run")
    ap.add_argument("--mtp", action="store_true", help="nextn k=3 (hybrid shapes)")
    ap.add_argument("--json")
    ap.add_argument("--cprofile", metavar="PATH",
                    help="also write cProfile's 60 costliest calls (cumulative) to PATH")
    a = ap.parse_args()
    prof = None
    if a.cprofile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    os.environ["TRITON_CACHE_DIR"] = a.triton_cache
    t_start = time.perf_counter()
    import torch
    from triton.runtime.jit import JITFunction

    from gpu_decode import build
    from mtpserve.config import SpeculativeConfig
    from mtpserve.engine import engine as engine_mod
    from mtpserve.engine.model_runner import ModelRunner

    compiles: list[tuple[str, float]] = []
    phases: dict[str, float] = collections.defaultdict(float)

    def timed(fn, label, into):
        def wrapper(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                into(label, args, time.perf_counter() - t)
        return wrapper

    def add_phase(label, _args, dt):
        phases[label] += dt

    def add_compile(_label, args, dt):
        compiles.append((args[0].fn.__name__, dt))

    JITFunction._do_compile = timed(JITFunction._do_compile, "", add_compile)
    ModelRunner.__init__ = timed(ModelRunner.__init__, "runner_init_s", add_phase)
    ModelRunner.capture_cuda_graphs = timed(ModelRunner.capture_cuda_graphs, "capture_s", add_phase)
    engine_mod.LLMEngine.warmup = timed(engine_mod.LLMEngine.warmup, "warmup_s", add_phase)
    t_import = time.perf_counter() - t_start
    spec = SpeculativeConfig(algorithm="nextn", num_steps=3, adaptive=False) if a.mtp else None
    eng, built = build(a.shape, False, spec)
    eng.warmup()
    torch.cuda.synchronize()
    ready = time.perf_counter() - t_start
    if prof is not None:
        import pstats
        prof.disable()
        with open(a.cprofile, "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
    by_name = collections.Counter()
    for name, dt in compiles:
        by_name[name] += dt
    row = dict(shape=a.shape, ready_s=ready, import_s=t_import, build_s=built, **phases,
               compiles=len(compiles), compile_s=sum(dt for _, dt in compiles),
               compile_by_kernel={k: round(v, 3) for k, v in by_name.most_common()})
    print(json.dumps(row, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
