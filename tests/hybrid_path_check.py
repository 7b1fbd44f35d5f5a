"""A whole tiny hybrid model through every layer's CUDA path (Triton's interpreter on the CPU,
``fused_kernel_check.triton_on_cpu(hybrid=True)``; attention stays on PyTorch's path) against its
PyTorch path: prefills, decodes, verifies and a mixed batch (tests/gdn_kernel_check.py's
``_drive``). Run by tests/test_hybrid_triton_path.py in a subprocess."""

from __future__ import annotations

import contextlib


def check_model_paths(out_norm: bool = False, **overrides) -> float:
    """Largest logit difference (float32) between the two paths of a tiny Qwen3-Next with
    ``overrides`` (e.g. ``shared_expert_intermediate_size=32``: the shared expert folded into
    the experts and each MoE block's per-choice outputs summed by the next norm);
    ``out_norm``: each one-token Gated DeltaNet's output norm inside its streamed out_proj
    (``GatedNormInput``; CUDA-only gates opened for the CPU, the calls counted; value heads of
    a power of two, e.g. ``linear_value_head_dim=16``). Besides _drive's batches, one sequence
    alone takes one-token decode steps (:func:`_drive_one`)."""
    from fused_kernel_check import triton_on_cpu
    from gdn_kernel_check import _drive
    from harness_hybrid import HybridHarness, tiny_hybrid_hf

    hf, cfg = tiny_hybrid_hf("qwen3_next", **overrides)
    runs = []
    for on in (False, True):
        h = HybridHarness(hf, hf_config=cfg, k=3)
        if on:
            for block in h.model.modules():   # on CUDA the router merges at construction
                if hasattr(block, "merge_router_weights"):
                    block.merge_router_weights()
            with triton_on_cpu("cpu", attention=False, hybrid=True), \
                    _out_norm_streamed_on_cpu(out_norm) as calls:
                runs.append(_drive(h)[0] + _drive_one(h))
            assert (calls[0] > 0) == out_norm, calls
        else:
            runs.append(_drive(h)[0] + _drive_one(h))
    (ref, got) = runs
    assert len(ref) == len(got) >= 11
    return max((a - b).abs().max().item() for a, b in zip(got, ref))


def _drive_one(h) -> list:
    """One sequence alone (the steps a batch-1 decode takes one token at a time): a prefill,
    two decodes, a verify of 3 drafts, a decode; each step's logits rows."""
    s = h.new_seq([(5 * i + 2) % 256 for i in range(14)], "alone")
    logits = []
    for step in ((s, 10), (s, 1), (s, 1), (s, 1, [3, 4, 5]), (s, 1)):
        logits += h.step([step])[0]
    return [x.clone() for x in logits if x.numel()]


@contextlib.contextmanager
def _out_norm_streamed_on_cpu(on: bool):
    """With ``on``: ``gemv_triton.gated_norm_fits`` answers for one CPU row as it would on
    CUDA, and the streamed product takes each out_proj in one chunk of all its inputs; yields
    [the number of products that took the norm in front]."""
    from unittest import mock

    from mtpserve.kernels import gemv_stream_triton as gs
    from mtpserve.kernels import gemv_triton

    calls = [0]
    if not on:
        yield calls
        return
    real = gs.gemv_stream

    def counted(x, *a, **kw):
        calls[0] += isinstance(x, gs.GatedNormInput)
        return real(x, *a, **kw)

    def fits(x, weight, head_dim):   # heads of a power of two, as gemv_triton's units ask
        k = weight.shape[1]
        return (x.dim() == 2 and x.shape[0] == 1 and k % head_dim == 0
                and (head_dim & (head_dim - 1)) == 0 and (k & (k - 1)) == 0)

    units = lambda rows, n, k: dict(block_n=8, block_k=k, num_warps=4, per_sm=2)  # noqa: E731
    with mock.patch.object(gemv_triton, "gated_norm_fits", fits), \
            mock.patch.object(gemv_triton, "stream_config", units), \
            mock.patch.object(gemv_triton, "gemv_stream", counted):
        yield calls
