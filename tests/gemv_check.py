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


def check_deferred_sum(device: str, n: int = 96, k: int = 2048, split: int = 4) -> int:
    """A split product asked to defer its sum (``gemv(defer_sum=True)``) returns its partials;
    summed by ``add_rms_norm`` (or ``SplitKPartials.total``) they give the same bits as the
    product that sums them itself followed by the same norm, for 1, 3 and MAX_ROWS rows; an
    unsplit product or one with bias returns the tensor. CPU: float32; CUDA: bfloat16. Returns
    the number of cases compared."""
    from mtpserve.kernels import gemv_triton

    default, gemv_triton.DEFER_SUM = gemv_triton.DEFER_SUM, True   # whatever the default
    try:
        return _check_deferred_sum(device, n, k, split)
    finally:
        gemv_triton.DEFER_SUM = default


def _check_deferred_sum(device: str, n: int, k: int, split: int) -> int:
    from mtpserve.kernels import arrival, fused_triton
    from mtpserve.kernels.gemv_triton import MAX_ROWS, SplitKPartials, gemv

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=g) * 0.05).to(device, dtype)
    nw = torch.rand(n, generator=g).to(device, dtype)
    cases = 0
    for m in (1, 3, MAX_ROWS):
        x = torch.randn(m, k, generator=g).to(device, dtype)
        res = torch.randn(m, n, generator=g).to(device, dtype)
        kw = dict(block_n=16, block_k=64 if device == "cpu" else 256, split_k=split)
        parts = gemv(x, w, defer_sum=True, **kw)
        assert isinstance(parts, SplitKPartials) and parts.parts.shape == (split, m, n)
        y = gemv(x, w, **kw)
        assert torch.equal(parts.total(), y)
        for a, b in zip(fused_triton.add_rms_norm(parts, res, nw, 1e-6, False),
                        fused_triton.add_rms_norm(y, res, nw, 1e-6, False)):
            assert torch.equal(a, b), m
        cases += 1
    one = dict(block_n=16, block_k=64 if device == "cpu" else 256, split_k=1)
    assert isinstance(gemv(x, w, defer_sum=True, **one), torch.Tensor)
    assert isinstance(gemv(x, w, torch.zeros(n, device=device, dtype=dtype), defer_sum=True,
                           split_k=split, block_n=16, block_k=one["block_k"]), torch.Tensor)
    assert int(arrival.counters(w.device).abs().sum()) == 0
    return cases


def check_deferred_model() -> dict:
    """A tiny Qwen3 (2 layers, intermediate 2048, so its down products split four ways) through
    the Triton path under the CPU interpreter (float32; every linear on the skinny product), a
    9-token prefill and 3 decode steps: logits with the deferred split-K sum bit-equal to those
    without, both within 1e-4 of the PyTorch path; the partials really flow into the norms.
    ~1 minute, so not in CI (run it when changing the deferred sum's wiring)::

        TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'tests'); \\
            import gemv_check as g; print(g.check_deferred_model())"
    """
    import fused_kernel_check as f
    from harness import tiny_hf_model

    import mtpserve.layers.linear as linear
    from mtpserve.config import ModelConfig
    from mtpserve.kernels import gemv_triton as G
    from mtpserve.models.llama import LlamaForCausalLM

    hf = tiny_hf_model("qwen3", intermediate_size=2048)
    cfg = ModelConfig.from_hf(hf.config)
    model = LlamaForCausalLM(cfg, 64).eval()
    model.load_weights(hf.state_dict().items())
    ids = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(4))
    saved = G.gemv, G.DEFER_SUM, linear.use_gemv
    deferred = []

    def counting(*a, **k):
        out = saved[0](*a, **k)
        deferred.append(isinstance(out, G.SplitKPartials))
        return out

    G.gemv, linear.use_gemv = counting, (lambda x, w: True)
    logits = {}
    try:
        with torch.inference_mode():
            ref, _ = f._run_steps(model, ids, "cpu", cfg)
            for on in (True, False):
                G.DEFER_SUM = on
                with f.triton_on_cpu("cpu", True):
                    logits[on], _ = f._run_steps(model, ids, "cpu", cfg)
    finally:
        G.gemv, G.DEFER_SUM, linear.use_gemv = saved
    assert sum(deferred) == 8, deferred      # 2 down products x (1 prefill + 3 decode steps)
    assert torch.equal(logits[True], logits[False])
    err = float((logits[True] - ref).abs().max())
    assert err <= 1e-4, err
    return {"partials_summed_by_norms": sum(deferred), "logits_abs_vs_pytorch": err}
