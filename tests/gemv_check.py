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


def check_prologues(device: str) -> float:
    """The products with a prologue (kernels/gemv_triton.py), CPU float32 under the interpreter
    or CUDA bfloat16 at Qwen3-1.7B's q/k/v and down shapes:

    - ``silu_mul_gemv(x, w)`` equals ``gemv(silu_and_mul(x), w)`` bit for bit (same tiles);
    - ``add_rms_norm_gemv`` returns ``s = residual + x`` bit for bit and a product within 1e-5
      (float32; bfloat16: 1e-2) of ``rms_norm(s) @ w^T`` in float32, for both norm weight
      conventions and with no residual (``s`` is then ``x`` itself);
    - both give a row the same bits whatever rows are beside it.

    Returns the worst relative error against the float32 references."""
    from mtpserve.kernels.fused_triton import silu_and_mul
    from mtpserve.kernels.gemv_triton import MAX_ROWS, add_rms_norm_gemv, gemv, silu_mul_gemv

    cpu = device == "cpu"
    dtype, tol = (torch.float32, 1e-5) if cpu else (torch.bfloat16, 1e-2)
    (n_qkv, k), (n_down, inter) = ((40, 300), (24, 200)) if cpu else ((4096, 2048), (2048, 6144))
    g = torch.Generator().manual_seed(7)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype)

    worst = 0.0
    gate_up, w_down = rand(MAX_ROWS, 2 * inter), rand(n_down, inter, scale=0.05)
    y = silu_mul_gemv(gate_up, w_down)
    assert torch.equal(y, gemv(silu_and_mul(gate_up), w_down))
    a = gate_up.float()
    ref = (torch.nn.functional.silu(a[:, :inter]) * a[:, inter:]) @ w_down.float().t()
    worst = max(worst, _rel(y, ref))
    for m in (1, 5):
        assert torch.equal(silu_mul_gemv(gate_up[:m], w_down), y[:m]), m

    x, res, w = rand(MAX_ROWS, k), rand(MAX_ROWS, k), rand(n_qkv, k, scale=0.05)
    norm_w, eps = rand(k, scale=0.1) + 1, 1e-6
    for residual in (res, None):
        for zero_centered in (False, True):
            y, s = add_rms_norm_gemv(x, residual, norm_w, eps, zero_centered, w)
            want_s = x if residual is None else (residual.float() + x.float()).to(dtype)
            assert torch.equal(s, want_s), (residual is None, zero_centered)
            sf = want_s.float()
            scale = norm_w.float() + (1.0 if zero_centered else 0.0)
            normed = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps) * scale
            worst = max(worst, _rel(y, normed @ w.float().t()))
            for m in (1, 5):
                part = add_rms_norm_gemv(x[:m], None if residual is None else residual[:m],
                                         norm_w, eps, zero_centered, w)
                assert torch.equal(part[0], y[:m]) and torch.equal(part[1], s[:m]), m
    assert worst < tol, worst
    return worst
