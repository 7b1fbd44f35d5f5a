"""Checks of the skinny product (kernels/gemv_triton.py) with its split-K reduction, for any
device: ``"cuda"`` (tests/test_gpu.py) or ``"cpu"`` under Triton's interpreter
(tests/test_gemv_kernel.py runs this in a subprocess, float32 only)::

    TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'tests'); \\
        import gemv_check as g; g.check_split_k('cpu')"

Raises AssertionError on a mismatch; returns the worst relative error it measured.
"""

from __future__ import annotations

import torch


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def check_split_k(device: str, shapes=((40, 300), (2048, 6144)), splits=(1, 2, 3, 8)) -> float:
    """For each [n, k] weight (CPU: float32, the first shape only; CUDA: bfloat16) and split:
    ``gemv`` within 1e-5 (float32 output) of a float32 reference, with and without bias; a
    row's bits do not depend on the rows beside it; repeated calls give the same bits; the
    counters of kernels/arrival.py are back to zero afterwards."""
    from mtpserve.kernels import arrival
    from mtpserve.kernels.gemv_triton import MAX_ROWS, gemv

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    worst = 0.0
    for n, k in shapes[:1] if device == "cpu" else shapes:
        g = torch.Generator().manual_seed(n * k)
        w = (torch.randn(n, k, generator=g) * 0.05).to(device, dtype)
        b = torch.randn(n, generator=g).to(device, dtype)
        x = torch.randn(MAX_ROWS, k, generator=g).to(device, dtype)
        ref = x.float() @ w.float().t()
        for split in splits:
            kw = dict(block_n=16, block_k=64 if device == "cpu" else 256, split_k=split,
                      out_dtype=torch.float32)
            out = gemv(x, w, b, **kw)
            worst = max(worst, _rel(out, ref + b.float()), _rel(gemv(x[:3], w, **kw), ref[:3]))
            assert worst < 1e-5, (n, k, split, worst)
            assert torch.equal(out, gemv(x, w, b, **kw)), (n, k, split)
            for m in (1, 5):
                assert torch.equal(out[:m], gemv(x[:m], w, b, **kw)), (n, k, split, m)
        assert int(arrival.counters(w.device).abs().sum()) == 0
    return worst


def check_silu_mul(device: str, shapes=((48, 300), (6144, 2048), (12288, 4096))) -> int:
    """``gemv_silu_mul`` over [2I, K] gate/up weights, both tile modes (CPU: float32, the
    first shape; CUDA: bfloat16, every shape: the 1.7B and 8B MLPs): within 1e-5 (CPU) / 1e-2
    (bfloat16 output) of ``silu(x Wg^T) * (x Wu^T)`` in float32; a row's bits do not depend on
    the rows beside it; an odd row count or an unknown tile mode raises ValueError; a weight
    whose gemv splits the reduction is not fusable (``fusable_silu_mul``). Returns how
    many elements, over every shape, mode and row count, differ from the two-launch
    ``silu_and_mul(gemv(x, w))``."""
    import pytest

    from mtpserve.kernels.fused_triton import silu_and_mul
    from mtpserve.kernels.gemv_triton import MAX_ROWS, gemv, gemv_silu_mul

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    differ = 0
    for inter, k in shapes[:1] if device == "cpu" else shapes:
        g = torch.Generator().manual_seed(inter + k)
        w = (torch.randn(2 * inter, k, generator=g) * 0.05).to(device, dtype)
        x = torch.randn(MAX_ROWS, k, generator=g).to(device, dtype)
        prod = x.float() @ w.float().t()
        ref = torch.nn.functional.silu(prod[:, :inter]) * prod[:, inter:]
        for tiles in ("half", "full"):
            y = gemv_silu_mul(x, w, tiles)
            assert y.shape == (MAX_ROWS, inter) and y.dtype == dtype
            assert _rel(y, ref) < (1e-5 if device == "cpu" else 1e-2), (inter, k, _rel(y, ref))
            for m in (1, 3):
                out = gemv_silu_mul(x[:m], w, tiles)
                assert torch.equal(out, y[:m]), (inter, k, m, tiles)
                differ += int((out != silu_and_mul(gemv(x[:m], w))).sum())
        with pytest.raises(ValueError, match="2I rows"):
            gemv_silu_mul(x, w[1:])
        with pytest.raises(ValueError, match="tiles must be"):
            gemv_silu_mul(x, w, "quarter")
    # where gemv splits the reduction (Qwen3-Next's shared expert shape, 2I = 1024, K = 2048),
    # the fused path is not taken: its bits would differ (the partials add in another order)
    from mtpserve.kernels.gemv_triton import fusable_silu_mul
    assert not fusable_silu_mul(torch.empty(1024, 2048, device=device, dtype=dtype))
    assert fusable_silu_mul(torch.empty(2 * 6144, 2048, device=device, dtype=dtype))
    return differ
