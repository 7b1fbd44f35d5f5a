"""Decode and verify step times on the GPU for random-weight models of real shapes (bf16).

For each shape: engine start-up time (weights generated on the device, KV sizing, CUDA graph
capture); the decode step time at batch 1 (median over steps after the prefill, prompt of 128
tokens, whole engine step: schedule, graph replay, sampling); total tok/s with 16 and 64 requests
decoding together; and the cost of a verify step of 1 + k tokens relative to a decode step
(graph replay of the forward alone, k = 3). With ``--mtp``, hybrid shapes also time a step with
MTP drafting; ``--token-map-size N`` adds one whose drafts use the FR-Spec head over the first N
token ids (``--speculative-token-map``, spec/draft_head.py); ``--draft-head-fp8`` adds each MTP
step again with its draft head behind an FP8 copy (``--speculative-draft-head-quantization``).

    python benchmarks/gpu_decode.py [--shapes smollm2-135m qwen3-1.7b qwen3-8b] [--json out.json]
    python benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 32768
    python benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --mtp-temperature 0.7
    python benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 32768 --draft-head-fp8
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

from mtpserve.bench.random_model import random_model_files
from mtpserve.config import EngineConfig, SpeculativeConfig
from mtpserve.engine.engine import LLMEngine
from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from mtpserve.engine.sequence import Sequence
from mtpserve.sampling_params import SamplingParams

PROMPT = 128


def build(shape: str, eager: bool, spec: SpeculativeConfig | None = None
          ) -> tuple[LLMEngine, float]:
    t = time.perf_counter()
    cfg = EngineConfig(dtype="bfloat16", device="cuda", max_model_len=4096, max_num_seqs=64,
                       enforce_eager=eager, gpu_memory_utilization=0.85, speculative=spec)
    eng = LLMEngine(cfg, files=random_model_files(shape))
    torch.cuda.synchronize()
    return eng, time.perf_counter() - t


def decode_run(eng: LLMEngine, n_req: int, new: int, temperature: float = 0.0
               ) -> tuple[float, float]:
    """(median decode step seconds, decode tokens/s) with ``n_req`` requests of ``new`` tokens
    (seeded sampling at ``temperature`` > 0)."""
    p = SamplingParams(max_tokens=new, temperature=temperature, ignore_eos=True,
                       seed=1 if temperature > 0 else None)
    for i in range(n_req):
        eng.add_request(f"r{time.monotonic_ns()}-{i}", [(7 * i + j) % 1000 + 2 for j in range(PROMPT)], p)
    times, tokens = [], 0
    sched = eng.scheduler
    while eng.has_unfinished_requests():
        decoding = (not sched.waiting and len(sched.running) == n_req
                    and not any(s.in_prefill for s in sched.running))
        t = time.perf_counter()
        outs = eng.step()
        if decoding:
            times.append(time.perf_counter() - t)
            tokens += sum(len(o.new_token_ids) for o in outs)
    return statistics.median(times), tokens / sum(times)


def forward_times(eng: LLMEngine, k: int = 3) -> dict[int, float]:
    """Seconds per forward (graph replay when captured; 200 repeats) of one sequence computing
    1 token (decode) and 1 token + k drafts (verify)."""
    r = eng.runner
    seq = Sequence("v", list(range(2, 2 + PROMPT)), SamplingParams(), (), eng.max_model_len,
                   None, None)
    assert eng.block_manager.allocate(seq, seq.num_tokens + k)
    if r.state_cache is not None:  # hybrid: a recurrent-state slot (the state is not checked)
        seq.state_slot = r.state_cache.alloc()
    seq.num_computed_tokens = seq.num_tokens - 1
    out = {}
    state = r.state_cache
    verify = state is None or state.conv_scratch[0].shape[0] > 0   # hybrid: needs speculation
    for q in ((1, 1 + k) if verify else (1,)):
        drafts = list(range(3, 3 + q - 1))
        batch, _ = r.prepare(SchedulerOutput([ScheduledSeq(seq, 1, drafts)]))
        for _ in range(10):
            r.execute(batch)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            r.execute(batch)
        torch.cuda.synchronize()
        out[q] = (time.perf_counter() - t) / 200
    eng.block_manager.free_seq(seq)
    if seq.state_slot is not None:
        r.state_cache.free(seq.state_slot)
    return out


HYBRID = ("qwen3-next-3b",)


def mtp_step(shape: str, eager: bool, plain_step: float, k: int = 3,
             token_map: str | None = None, label: str = "mtp", temperature: float = 0.0,
             sampled_drafts: bool = False, quantization: str | None = None) -> dict:
    """Batch-1 engine step with MTP drafting (k steps, adaptive off: every step drafts k and
    verifies 1 + k) against the plain decode step; random weights accept ~nothing, so this is
    the cost side of speculation. ``token_map``: drafts through the FR-Spec head over its ids;
    ``temperature`` > 0: sampling requests, drafting the MTP's argmax or with
    ``sampled_drafts`` drawing them step by step; ``quantization`` "fp8": greedy drafts through
    the FP8 draft head (spec/draft_head.py). Keys of the result start with ``label``."""
    spec = SpeculativeConfig(algorithm="nextn", num_steps=k, adaptive=False, token_map=token_map,
                             draft_head_quantization=quantization)
    eng, ready = build(shape, eager, spec)
    if quantization and type(eng.proposer.head).__name__ != "Fp8GreedyHead":
        raise RuntimeError(f"{label}: the engine drafts through {type(eng.proposer.head)}")
    eng.proposer.sampled_drafts = sampled_drafts
    eng.warmup()
    step, _ = decode_run(eng, 1, 128, temperature)
    _, tps16 = decode_run(eng, 16, 64, temperature)
    m = eng.spec_metrics
    fwd = forward_times(eng, k)
    print(f"{shape:16} {label} k={k}: ready {ready:.1f} s, b1 step {step * 1e3:.3f} ms "
          f"= {step / plain_step:.2f}x decode, b16 {tps16:.0f} tok/s, target forward 1+{k} "
          f"{fwd[1 + k] * 1e3:.3f} ms vs 1 {fwd[1] * 1e3:.3f} ms, acceptance length "
          f"{m.acceptance_length or 0:.2f}")
    eng.proposer = None
    eng.runner.graphs = None
    del eng
    gc.collect()
    torch.cuda.empty_cache()
    out = dict(ready_s=ready, step_ms=step * 1e3, step_over_decode=step / plain_step,
               b16_tok_s=tps16, forward1_ms=fwd[1] * 1e3, forward_verify_ms=fwd[1 + k] * 1e3,
               acceptance_length=m.acceptance_length)
    return {f"{label}_{key}": v for key, v in out.items()}


def mtp_steps(shape: str, eager: bool, plain_step: float, map_size: int | None,
              temperature: float | None = None, fp8: bool = False) -> dict:
    """``mtp_step`` keys ``mtp_*``; with ``map_size`` also ``mtp_fr_*``: the same step with the
    FR-Spec draft head over ids 0..map_size-1 (a JSON token map in a temporary file); with
    ``temperature`` also ``mtp_t_*`` and ``mtp_t_drawn_*``: sampling requests, argmax drafts
    and drafts drawn step by step; with ``fp8`` also ``mtp_fp8_*`` (and ``mtp_fr_fp8_*``):
    each head behind its FP8 copy."""
    rows = mtp_step(shape, eager, plain_step)
    if fp8:
        rows.update(mtp_step(shape, eager, plain_step, label="mtp_fp8", quantization="fp8"))
    if temperature:
        rows.update(mtp_step(shape, eager, plain_step, label="mtp_t", temperature=temperature))
        rows.update(mtp_step(shape, eager, plain_step, label="mtp_t_drawn",
                             temperature=temperature, sampled_drafts=True))
    if map_size:
        with tempfile.TemporaryDirectory() as d:
            path = first_ids_map(map_size, d)
            rows.update(mtp_step(shape, eager, plain_step, token_map=path, label="mtp_fr"))
            if fp8:
                rows.update(mtp_step(shape, eager, plain_step, token_map=path,
                                     label="mtp_fr_fp8", quantization="fp8"))
    return rows


def first_ids_map(size: int, directory: str) -> str:
    """Write an FR-Spec token map of ids 0..size-1 (BPE vocabularies are ordered roughly by
    merge frequency, so low ids are the frequent tokens) as ``directory/token_map.json``;
    return its path."""
    path = Path(directory) / "token_map.json"
    path.write_text(json.dumps(list(range(size))))
    return str(path)


def recaptured(eng: LLMEngine, shape: str, label: str, settings: list[tuple]) -> dict:
    """Batch-1 decode and forward times and batch-16 and 64 tokens/s with each (module, attr, value)
    of ``settings`` set (graphs recaptured, then the settings and the graphs restored). Keys of
    the result start with ``label``."""
    try:
        with contextlib.ExitStack() as stack:
            for module, attr, value in settings:
                stack.enter_context(mock.patch.object(module, attr, value))
            eng.runner.capture_cuda_graphs()
            step1, _ = decode_run(eng, 1, 128)
            fwd = forward_times(eng)
            _, tps16 = decode_run(eng, 16, 64)
            _, tps64 = decode_run(eng, 64, 64)
    finally:   # the graphs for the settings restored
        eng.runner.capture_cuda_graphs()
    fwd4 = fwd.get(4, float("nan"))
    print(f"{shape:16} {label}: fwd1 {fwd[1] * 1e3:.3f} ms, fwd4 {fwd4 * 1e3:.3f} ms, b1 "
          f"{step1 * 1e3:.3f} ms/step, verify4/1 {fwd4 / fwd[1]:.3f}, b16 {tps16:.0f}, b64 "
          f"{tps64:.0f} tok/s")
    return {f"{label}_forward1_ms": fwd[1] * 1e3, f"{label}_forward4_ms": fwd4 * 1e3,
            f"{label}_b1_ms": step1 * 1e3, f"{label}_b16_tok_s": tps16,
            f"{label}_b64_tok_s": tps64}


def named_switches() -> dict:
    """``--compare``'s named switches: name -> (module, attr, value)."""
    from mtpserve.kernels import gemv_triton, paged_attention_triton, pdl
    from mtpserve.layers import gated_attention, linear_attention, moe

    return {"cublas": (gemv_triton, "ENABLED", False), "no_pdl": (pdl, "ENABLED", False),
                "no_fused_gated_attention": (gated_attention, "FUSED", False),
                "no_moe_combine": (moe, "COMBINE_KERNEL", False),
                "no_folded_shared_expert": (moe, "FOLD_SHARED_EXPERT", False),
                "no_deferred_moe_sum": (moe, "DEFER_SUM", False),
                "no_fused_out_norm": (linear_attention, "FUSED_OUT_NORM", False),
                "no_pair_kernel": (paged_attention_triton, "PAIR_KERNEL_PAIRS_PER_SM", 10 ** 9),
                "no_deferred_sum": (gemv_triton, "DEFER_SUM", False),
                "deferred_sum": (gemv_triton, "DEFER_SUM", True),
                "always_pair_kernel": (paged_attention_triton, "PAIR_KERNEL_PAIRS_PER_SM", 0),
                "no_swiglu_epilogue": (gemv_triton, "SWIGLU_EPILOGUE", False),
                "no_preload": (gemv_triton, "PRELOAD", False),
                "no_stream": (gemv_triton, "STREAM", False),
                "early_kv": (paged_attention_triton, "EARLY_KV", True),
                "no_fused_inputs": (gemv_triton, "FUSED_INPUTS", False),
                "recaptured": (gemv_triton, "ENABLED", gemv_triton.ENABLED)}


def compare_kernels(eng: LLMEngine, shape: str, which: list[str]) -> dict:
    """The ``recaptured`` timings for each switch named in ``which`` (see ``--compare``)."""
    switches = named_switches()
    out = {}
    for i, label in enumerate(which):   # a label named again keys its row label_2, label_3, ...
        n = which[:i + 1].count(label)
        settings = [switches[part] if part in switches else parse_setting(part)
                    for part in label.split("+")]
        out.update(recaptured(eng, shape, label if n == 1 else f"{label}_{n}", settings))
    return out


def parse_setting(spec: str) -> tuple:
    """``MODULE:ATTR:VALUE`` -> (module, attr, value) with VALUE a Python literal; SystemExit
    for an unknown module or attribute."""
    import ast
    import importlib

    try:
        module, attr, value = spec.split(":", 2)
        mod = importlib.import_module(module)
    except (ValueError, ImportError) as e:
        raise SystemExit(f"{spec!r}: not a switch or MODULE:ATTR:VALUE ({e})")
    if not hasattr(mod, attr):
        raise SystemExit(f"{spec!r}: {module} has no {attr}")
    return mod, attr, ast.literal_eval(value)


def set_constant(spec: str) -> None:
    """``MODULE:ATTR:VALUE``: ``MODULE.ATTR = literal_eval(VALUE)`` (``--set``)."""
    mod, attr, value = parse_setting(spec)
    setattr(mod, attr, value)
    print(f"{mod.__name__}.{attr} = {value!r}")


def sync_steps(eng: LLMEngine, shape: str) -> dict:
    """Batch-1 step and batch-64 tokens/s with async scheduling off (engine/overlap.py)."""
    eng.async_scheduling = False
    try:
        step1, _ = decode_run(eng, 1, 128)
        _, tps64 = decode_run(eng, 64, 64)
    finally:
        eng.async_scheduling = True
    print(f"{shape:16} async scheduling off: b1 {step1 * 1e3:.3f} ms/step, b64 {tps64:.0f} tok/s")
    return dict(sync_b1_ms=step1 * 1e3, sync_b64_tok_s=tps64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["smollm2-135m", "qwen3-1.7b", "qwen3-8b"])
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--mtp", action="store_true", help="hybrid shapes: also a step with MTP")
    ap.add_argument("--token-map-size", type=int, metavar="N",
                    help="with --mtp: also a step whose MTP drafts use the FR-Spec head over "
                         "token ids 0..N-1 (BPE vocabularies are ordered roughly by merge "
                         "frequency, so low ids are the frequent tokens); keys mtp_fr_*")
    ap.add_argument("--draft-head-fp8", action="store_true",
                    help="--mtp: also each MTP step with its draft head behind an FP8 copy")
    ap.add_argument("--mtp-temperature", type=float, metavar="T",
                    help="with --mtp: also MTP steps of sampling requests at T, drafting the "
                         "MTP's argmax (mtp_t_*) and drawing drafts step by step (mtp_t_drawn_*)")
    ap.add_argument("--compare", nargs="+", default=[],
                    metavar="SWITCH",
                    help="cublas, no_pdl, no_pair_kernel, no_deferred_sum, deferred_sum, "
                         "always_pair_kernel, no_swiglu_epilogue, no_preload (no preloaded "
                         "tiles: pipelined, or streamed at one row), no_stream (one-row products in tiles, "
                         "not streamed), no_fused_inputs (norms and SiLU-and-mul in their own "
                         "kernels at one row), no_fused_gated_attention, no_moe_combine, "
                         "no_folded_shared_expert, no_deferred_moe_sum, no_fused_out_norm (hybrid shapes: session "
                         "33's kernels off; no_moe_combine also unfolds), recaptured, or "
                         "MODULE:ATTR:VALUE (that constant set, the graphs recaptured; "
                         "several joined by '+' set together): "
                         "also time batch-1 decode and batch-64 tok/s with every product on "
                         "cuBLAS, without PDL, with attention partitions always in parallel "
                         "programs and a merge kernel (or always one program per token and KV "
                         "head running all its partitions), with split products summing their "
                         "own partials or leaving them to the next norm (gemv_triton.DEFER_SUM off "
                         "/ on), with the interleaved gate/up product followed by a "
                         "SiLU-and-mul kernel instead of its SwiGLU epilogue "
                         "(gemv_triton.SWIGLU_EPILOGUE off), or with nothing changed "
                         "(recaptured: the spread between two captures of the same setting; "
                         "name it first and last to bracket the others)")
    ap.add_argument("--set", nargs="+", default=[], metavar="MODULE:ATTR:VALUE",
                    help="set a module constant before the engines are built, e.g. "
                         "mtpserve.kernels.gemv_triton:SWIGLU_MIN_K:4096 (VALUE read as a Python "
                         "literal)")
    ap.add_argument("--sync-compare", action="store_true",
                    help="also time batch 1 and 64 with async scheduling off")
    ap.add_argument("--json")
    a = ap.parse_args()
    for spec in a.set:
        set_constant(spec)
    for label in a.compare:   # a typo stops here, before any engine is built
        for part in label.split("+"):
            if part not in named_switches():
                parse_setting(part)
    if a.token_map_size is not None and (a.token_map_size < 1 or not a.mtp):
        ap.error("--token-map-size needs N >= 1 and --mtp")
    rows = {}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, "
          f"{'eager' if a.eager else 'CUDA graphs'}")
    print(f"{'shape':16}{'ready s':>8}{'fwd1 ms':>9}{'b1 ms/step':>12}{'b1 tok/s':>10}"
          f"{'b16 tok/s':>11}{'b64 tok/s':>11}{'verify4/1':>10}")
    for shape in a.shapes:
        eng, ready = build(shape, a.eager)
        eng.warmup()
        step1, _ = decode_run(eng, 1, 128)
        _, tps16 = decode_run(eng, 16, 64)
        _, tps64 = decode_run(eng, 64, 64)
        fwd = forward_times(eng)
        fwd.setdefault(4, float("nan"))
        ratio = fwd[4] / fwd[1]
        rows[shape] = dict(ready_s=ready, forward1_ms=fwd[1] * 1e3, forward4_ms=fwd[4] * 1e3,
                           b1_ms=step1 * 1e3, b1_tok_s=1 / step1, b16_tok_s=tps16,
                           b64_tok_s=tps64, verify4_over_decode=ratio)
        print(f"{shape:16}{ready:8.1f}{fwd[1] * 1e3:9.3f}{step1 * 1e3:12.3f}{1 / step1:10.0f}"
              f"{tps16:11.0f}{tps64:11.0f}{ratio:10.2f}")
        if a.sync_compare:
            rows[shape].update(sync_steps(eng, shape))
        if a.compare and not a.eager:
            rows[shape].update(compare_kernels(eng, shape, a.compare))
        eng.runner.graphs = None
        del eng
        gc.collect()   # engines hold reference cycles: free their memory before the next
        torch.cuda.empty_cache()
        if a.mtp and shape in HYBRID:
            rows[shape].update(mtp_steps(shape, a.eager, step1, a.token_map_size,
                                         a.mtp_temperature, a.draft_head_fp8))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
