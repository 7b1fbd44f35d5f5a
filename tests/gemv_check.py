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
