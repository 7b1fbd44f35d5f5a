"""Every Triton kernel an MTP engine step of the tiny hybrid launches, compiled for sm_90 (H100 /
H200) without a GPU: Triton's interpreter accepts code its compiler refuses, and kernels that have
only run under the interpreter (sessions 32-34 had no GPU) would otherwise first meet the compiler
when a server starts on a GPU.

Two steps, two processes (tests/test_hopper_compile.py):

1. :func:`record_launches` (under ``TRITON_INTERPRET=1``): whole MTP engine steps of the tiny
   Qwen3-Next in bfloat16 on the CPU with every layer on its Triton path
   (benchmarks/cpu_kernel_census.py's ``engine_census``), once with the shared expert folded, once
   unfolded (with the combine kernel), the verify's acceptance kernel on as on CUDA; then the streamed one-row products
   with their inputs fused in front, which batch-1 decode steps launch; each launch's kernel
   and arguments (tensors as their dtype) and launch options, without repeats.
2. :func:`compile_recorded` (no interpreter): each recorded launch compiled for
   ``GPUTarget("cuda", 90, 32)`` from its arguments, with what differs on CUDA set as CUDA sets
   it: ``PDL`` on (with ``launch_pdl``), ``LATE`` on (the inline-asm widening of 16-bit weights).
   Integer arguments compile as i32 or i64 by value, without Triton's divisibility
   specializations.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import torch

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
           torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
           torch.uint8: "u8", torch.bool: "i1"}
# constexprs that the CPU sets otherwise than CUDA does: the value a CUDA launch gives them
_ON_CUDA = {"PDL": True, "LATE": True}
_OPTIONS = ("num_warps", "num_stages", "launch_pdl", "maxnreg")


def _value(v):
    """A launch argument as JSON: a tensor as {"dtype": ...}; scalars and None as they are."""
    if isinstance(v, torch.Tensor):
        return {"dtype": _DTYPES[v.dtype]}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"launch argument of type {type(v).__name__}")


def record_launches(steps: int = 2) -> list[dict]:
    """Launches of ``steps`` MTP engine steps (and the prefill and warm-up steps before them) in
    both configurations (module doc), each once: [{"module", "kernel", "args", "options"}]."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from triton.runtime.interpreter import InterpretedFunction

    import cpu_kernel_census as census

    from mtpserve.layers import moe
    from mtpserve.spec import draft_ahead

    seen, out = set(), []
    run = InterpretedFunction.run

    def recorded(self, *args, grid, warmup, **kwargs):
        names = self.arg_names
        values = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
        entry = {"module": self.fn.__module__, "kernel": self.fn.__name__,
                 "args": {k: _value(v) for k, v in values.items()},
                 "options": {k: kwargs[k] for k in _OPTIONS if k in kwargs}}
        key = json.dumps(entry, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(entry)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recorded
    saved = moe.FOLD_SHARED_EXPERT, draft_ahead.use_triton
    draft_ahead.use_triton = lambda x: True   # the verify graph's acceptance kernel
    try:
        for fold in (True, False):
            moe.FOLD_SHARED_EXPERT = fold
            census.engine_census("tiny-qwen3-next", 3, steps)
        _fused_input_products()
    finally:
        InterpretedFunction.run = run
        moe.FOLD_SHARED_EXPERT, draft_ahead.use_triton = saved
    return out


def _fused_input_products() -> None:
    """Streamed one-row products (kernels/gemv_stream_triton.py) with each input fused in front,
    in bfloat16: a Gated DeltaNet's output norm over two chunks, a residual add + RMSNorm, a
    SiLU-and-mul. They run in batch-1 decode steps, which the MTP steps above do not take."""
    from mtpserve.kernels.gemv_stream_triton import GatedNormInput, NormInput, gemv_stream

    bf = dict(dtype=torch.bfloat16)
    w = torch.randn(32, 64, **bf)
    x, z, r = (torch.randn(1, 64, **bf) for _ in range(3))
    unit = dict(block_n=8, num_warps=4)
    gemv_stream(GatedNormInput(x, z, torch.ones(16, **bf), 1e-6), w, block_k=32, **unit)
    gemv_stream(NormInput(x, r, torch.ones(64, **bf), 1e-6, torch.empty_like(x)), w,
                block_k=64, **unit)
    gemv_stream(torch.randn(1, 128, **bf), w, block_k=32, silu_input=True, **unit)


def _signature(jit, args: dict) -> tuple[dict, dict]:
    """(signature, constexprs) of ``jit`` for recorded ``args``, CUDA's values where they differ."""
    sig, consts = {}, {}
    for p in jit.params:
        v = args.get(p.name, p.default if p.has_default else None)
        if p.is_constexpr or v is None:
            sig[p.name], consts[p.name] = "constexpr", _ON_CUDA.get(p.name, v)
        elif isinstance(v, dict):
            sig[p.name] = "*" + v["dtype"]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise ValueError(f"{jit.__name__}: argument {p.name} = {v!r}")
    return sig, consts


def compile_recorded(launches: list[dict]) -> dict:
    """Compile each launch for sm_90 (module doc): {"kernel (n)": shared memory bytes}, and
    {"failed": {"kernel (n)": error}} for those the compiler refused."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    done, failed = {}, {}
    for i, launch in enumerate(launches):
        jit = getattr(importlib.import_module(launch["module"]), launch["kernel"])
        name = f"{launch['kernel']} ({i})"
        try:
            sig, consts = _signature(jit, launch["args"])
            options = dict(launch["options"])
            if "PDL" in consts:
                options["launch_pdl"] = True
            kernel = triton.compile(ASTSource(jit, sig, consts), target=target, options=options)
            done[name] = kernel.metadata.shared
        except Exception as e:   # noqa: BLE001 (reported, the test fails on any)
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return {"compiled": done, "failed": failed}
