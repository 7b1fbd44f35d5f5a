"""Count the kernels a hybrid forward launches on its CUDA path, on the CPU: Triton's
interpreter runs the Triton kernels, every layer's ``use_triton`` answers True, and each launch
(a Triton kernel, or a PyTorch op that would launch a CUDA kernel) is tallied by the mtpserve
line that made it. No timing: the list says which small PyTorch ops are left between the
Triton kernels of a decode or verify step (each one a kernel boundary inside the CUDA graph).

    python benchmarks/cpu_kernel_census.py [--shape tiny-qwen3-next] [--drafts 3] [--layers 12]

Products run as PyTorch ``mm`` here (the skinny Triton products need CUDA): each counts as one
kernel, as one Triton product is (a split one may add its sum, or defer it into the next norm).
Views, allocations and other ops that launch nothing are not counted.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported

import argparse  # noqa: E402
import collections  # noqa: E402
import importlib  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from unittest import mock  # noqa: E402

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

# ops that launch no CUDA kernel: views, metadata, allocations
NO_KERNEL = {
    "view", "_unsafe_view", "_reshape_alias", "slice", "select", "split", "split_with_sizes", "unbind",
    "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "as_strided", "alias",
    "detach", "empty", "empty_like", "empty_strided", "new_empty",
    "new_empty_strided", "lift_fresh", "narrow", "chunk", "is_same_size",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "dim", "size", "stride",
    "view_as", "result_type", "is_nonzero", "detach_", "resolve_conj", "resolve_neg",
}
# under inference mode these reach the dispatcher whole: a kernel only when they copy
VIEW_IF_IT_CAN = {"reshape", "flatten", "unflatten", "contiguous"}
# layer modules whose dispatch answers True here (Triton paths)
TRITON_MODULES = ("layers.norm", "layers.rotary", "layers.activation", "layers.attention",
                  "layers.embedding", "layers.gated_attention", "layers.linear_attention",
                  "layers.moe", "models.mtp", "models.qwen3_next", "engine.state_cache",
                  "kernels.argmax_triton")


def _caller() -> str:
    """The innermost mtpserve frame outside the kernels' own launch code: ``file:line``."""
    for f in reversed(traceback.extract_stack()[:-2]):
        if "/mtpserve/" in f.filename and "cpu_kernel_census" not in f.filename:
            return f"{f.filename.split('/mtpserve/')[-1]}:{f.lineno}"
    return "?"


class Census(TorchDispatchMode):
    """Tallies PyTorch ops that launch a kernel, and Triton launches (patched ``run``)."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.inside_triton = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        if self.inside_triton or _no_op_copy(name, args, kwargs):
            return out
        if name in VIEW_IF_IT_CAN:   # a copy when the strides do not allow a view
            if _same_storage(out, args[0]):
                return out
            name += " (a copy)"
        elif name in NO_KERNEL:
            return out
        self.counts[("torch", name, _caller())] += 1
        return out


def _same_storage(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _no_op_copy(name: str, args, kwargs) -> bool:
    """``_to_copy`` / ``to`` to the same dtype (and device) returns the tensor itself."""
    if name not in ("_to_copy", "to"):
        return False
    kw = kwargs or {}
    dtype = kw.get("dtype", next((a for a in args[1:] if isinstance(a, torch.dtype)), None))
    return dtype in (None, args[0].dtype) and kw.get("device") in (None, args[0].device)


def _patch(census: Census) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def counted(self, *args, grid, warmup, **kwargs):
        if not warmup:
            census.counts[("triton", self.fn.__name__, _caller())] += 1
        census.inside_triton += 1
        try:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            census.inside_triton -= 1

    InterpretedFunction.run = counted
    for name in TRITON_MODULES:
        mod = importlib.import_module(f"mtpserve.{name}")
        if hasattr(mod, "use_triton"):
            mod.use_triton = lambda x: True


def _runner(shape: str, drafts: int, layers: int | None):
    from mtpserve.bench.random_model import SHAPES, random_model_files
    from mtpserve.config import EngineConfig, ModelConfig, SpeculativeConfig
    from mtpserve.engine.block_manager import BlockManager
    from mtpserve.engine.model_runner import ModelRunner

    # ``layers``: the layer structure of a larger shape at this one's widths
    override = {shape: {**SHAPES[shape], "num_hidden_layers": layers}} if layers else {}
    with mock.patch.dict(SHAPES, override):
        files = random_model_files(shape, device="cpu")
    cfg = EngineConfig(device="cpu", dtype="bfloat16", num_kv_blocks=64, block_size=16,
                       enable_prefix_caching=False, max_num_seqs=4,
                       speculative=SpeculativeConfig("nextn", num_steps=drafts))
    runner = ModelRunner(cfg, ModelConfig.from_hf(files.hf_config), files, 512)
    from mtpserve.layers.moe import SparseMoeBlock

    for m in runner.model.modules():   # one router + shared-gate product, as on CUDA
        if isinstance(m, SparseMoeBlock):
            m.merge_router_weights()
    return runner, BlockManager(64, 16, enable_prefix_caching=False)


def _step(runner, bm, seq, n: int, drafts: list[int]) -> None:
    from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput

    assert bm.allocate(seq, seq.num_computed_tokens + n + len(drafts))
    batch, _ = runner.prepare(SchedulerOutput([ScheduledSeq(seq, n, list(drafts))]))
    with torch.inference_mode():
        runner.execute(batch)


def census_of(shape: str, drafts: int, layers: int | None = None
              ) -> dict[str, collections.Counter]:
    """Kernels of a decode step (1 token) and a verify step (1 + ``drafts`` tokens) of one
    sequence after a 20-token prefill and one uncounted step of each kind (what a layer
    caches at its first call of a shape is made outside CUDA graphs): {step: Counter((kind,
    name, line) -> launches)}."""
    from mtpserve.engine.sequence import Sequence
    from mtpserve.sampling_params import SamplingParams

    runner, bm = _runner(shape, drafts, layers)
    seq = Sequence("r", list(range(2, 22)), SamplingParams(), (), 10**6, None, None)
    seq.state_slot = runner.state_cache.alloc()
    census = Census()
    _patch(census)
    out = {}
    with census:
        _step(runner, bm, seq, 20, [])
        seq.num_computed_tokens = 20
        seq.token_ids.append(5)
        verify = list(range(7, 7 + drafts))
        for name, d in (("", []), ("", verify), ("decode", []), ("verify", verify)):
            census.counts.clear()
            _step(runner, bm, seq, 1, d)
            if name:
                out[name] = collections.Counter(census.counts)
            seq.num_computed_tokens += 1
            seq.token_ids.append(6)
    return out


def engine_census(shape: str, drafts: int, steps: int = 6
                  ) -> tuple[collections.Counter, int]:
    """Kernels of whole engine steps of one greedy request with MTP speculation (``drafts``
    per step; verify, observe, draft chain, acceptance, state rollback, all the engine
    launches): the launches of ``steps`` steps after the prefill and two warm-up steps, and
    the number of steps counted. Random weights: every draft is rejected, as in
    gpu_decode.py's MTP step."""
    from mtpserve.bench.random_model import random_model_files
    from mtpserve.config import EngineConfig, SpeculativeConfig
    from mtpserve.engine.engine import LLMEngine
    from mtpserve.layers.moe import SparseMoeBlock
    from mtpserve.sampling_params import SamplingParams

    census = Census()
    _patch(census)
    cfg = EngineConfig(device="cpu", dtype="bfloat16", max_model_len=512, max_num_seqs=4,
                       speculative=SpeculativeConfig("nextn", num_steps=drafts))
    eng = LLMEngine(cfg, files=random_model_files(shape, device="cpu"))
    for m in eng.runner.model.modules():   # one router + shared-gate product, as on CUDA
        if isinstance(m, SparseMoeBlock):
            m.merge_router_weights()
    eng.add_request("r", list(range(2, 22)),
                    SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    with census:
        for _ in range(3):   # the prefill, then two steps that make what later steps reuse
            eng.step()
        census.counts.clear()
        for _ in range(steps):
            eng.step()
    return collections.Counter(census.counts), steps


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="tiny-qwen3-next")
    ap.add_argument("--drafts", type=int, default=3)
    ap.add_argument("--layers", type=int, default=None,
                    help="decoder layers (qwen3-next-3b's structure: 12, full attention every 4th)")
    ap.add_argument("--engine-steps", type=int, default=0, metavar="N",
                    help="instead: N whole engine steps with MTP drafting (per step)")
    args = ap.parse_args(argv)
    if args.engine_steps:
        counts, n = engine_census(args.shape, args.drafts, args.engine_steps)
        print(f"== {n} MTP engine steps: {sum(counts.values()) / n:.1f} kernels a step")
        for (kind, name, line), c in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][2])):
            print(f"{c / n:6.1f}  {kind:6s} {name:32s} {line}")
        return
    for step, counts in census_of(args.shape, args.drafts, args.layers).items():
        kinds = collections.Counter()
        for (kind, _, _), n in counts.items():
            kinds[kind] += n
        print(f"== {step}: {sum(counts.values())} kernels ({kinds['triton']} Triton, "
              f"{kinds['torch']} PyTorch)")
        for (kind, name, line), n in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][2])):
            print(f"{n:4d}  {kind:6s} {name:32s} {line}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
