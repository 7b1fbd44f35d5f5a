"""A whole tiny hybrid model through every layer's CUDA path (Triton's interpreter on the CPU,
``fused_kernel_check.triton_on_cpu(hybrid=True)``; attention stays on PyTorch's path) against its
PyTorch path: prefills, decodes, verifies and a mixed batch (tests/gdn_kernel_check.py's
``_drive``). Run by tests/test_hybrid_triton_path.py in a subprocess."""

from __future__ import annotations


def check_model_paths(stream: bool = False, **overrides) -> float:
    """Largest logit difference (float32) between the two paths of a tiny Qwen3-Next with
    ``overrides`` (e.g. ``shared_expert_intermediate_size=32``: the shared expert folded into
    the experts and each MoE block's per-choice outputs summed by the next norm); ``stream``:
    the experts of decode and verify steps through kernels/moe_stream_triton.py (units that
    divide the tiny widths, H 64 and I 32)."""
    from fused_kernel_check import triton_on_cpu
    from gdn_kernel_check import _drive
    from harness_hybrid import HybridHarness, tiny_hybrid_hf

    from mtpserve.kernels import fused_moe_triton as fm

    fm.STREAM = stream
    fm.STREAM_UNITS = dict(gate_up_n=8, gate_up_k=16, down_n=16, down_k=16, num_warps=4,
                           per_sm=2)

    hf, cfg = tiny_hybrid_hf("qwen3_next", **overrides)
    runs = []
    for on in (False, True):
        h = HybridHarness(hf, hf_config=cfg, k=3)
        if on:
            for block in h.model.modules():   # on CUDA the router merges at construction
                if hasattr(block, "merge_router_weights"):
                    block.merge_router_weights()
            with triton_on_cpu("cpu", attention=False, hybrid=True):
                runs.append(_drive(h)[0])
        else:
            runs.append(_drive(h)[0])
    (ref, got) = runs
    assert len(ref) == len(got) >= 6
    return max((a - b).abs().max().item() for a, b in zip(got, ref))
