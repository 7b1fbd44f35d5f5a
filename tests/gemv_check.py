"""Checks of the skinny product (kernels/gemv_triton.py) with its split-K reduction and its
SwiGLU epilogue over interleaved gate/up rows, for any device: ``"cuda"`` (tests/test_gpu.py) or
``"cpu"`` under Triton's interpreter (tests/test_gemv_kernel.py runs this in a subprocess,
float32 inputs only)::

    TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'tests'); \\
        import gemv_check as g; g.check_split_k('cpu')"

Raises AssertionError on a mismatch; each check returns what it measured or counted.
"""

from __future__ import annotations

from unittest import mock

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


def check_preload(device: str) -> float:
    """Preloaded tiles (``gemv(preload=True)``: the whole tile loaded before the PDL wait, then
    multiplied row by row). CPU (float32): [40, 300] in one 16 x 512 tile per 16 rows, and
    [96, 2048] in 16 x 512 tiles split four ways; CUDA (bfloat16): the 1.7B o shape and the
    135M q/k/v, o and down shapes in tile_config's tiles (16 x next power of two of K). Within
    1e-5 of a float32 reference (float32 output), with and without bias; a row's bits do not
    depend on the rows beside it; repeatable bit for bit; a split product's deferred partials
    sum to the same bits; a tile shorter than its share of the reduction is refused. Returns the
    worst relative error."""
    from mtpserve.kernels import arrival
    from mtpserve.kernels.gemv_triton import MAX_ROWS, gemv

    if device == "cpu":
        dtype, cases = torch.float32, [(40, 300, 512, 1, 4), (96, 2048, 512, 4, 4)]
    else:
        dtype = torch.bfloat16
        cases = [(n, k, 1 << (k - 1).bit_length(), 1, 8)
                 for n, k in [(2048, 2048), (960, 576), (576, 576), (576, 1536)]]
    worst = 0.0
    for n, k, block_k, split, warps in cases:
        g = torch.Generator().manual_seed(n + k)
        w = (torch.randn(n, k, generator=g) * 0.05).to(device, dtype)
        b = torch.randn(n, generator=g).to(device, dtype)
        x = torch.randn(MAX_ROWS, k, generator=g).to(device, dtype)
        ref = x.float() @ w.float().t()
        kw = dict(block_n=16, block_k=block_k, num_warps=warps, split_k=split, preload=True)
        out = gemv(x, w, b, out_dtype=torch.float32, **kw)
        worst = max(worst, _rel(out, ref + b.float()))
        assert worst < 1e-5, (n, k, worst)
        assert torch.equal(out, gemv(x, w, b, out_dtype=torch.float32, **kw)), (n, k)
        y = gemv(x, w, **kw)
        for m in (1, 3, 5):
            assert torch.equal(y[:m], gemv(x[:m], w, **kw)), (n, k, m)
        if split > 1:
            assert torch.equal(gemv(x, w, defer_sum=True, **kw).total(), y), (n, k)
        assert int(arrival.counters(w.device).abs().sum()) == 0
    try:
        gemv(x, w, block_n=16, block_k=128, split_k=1, preload=True)
    except ValueError as e:
        assert "shorter than" in str(e)
    else:
        raise AssertionError("a preloaded tile shorter than its reduction was taken")
    return worst


def check_deferred_sum(device: str, n: int = 96, k: int = 2048, split: int = 4) -> int:
    """A split product asked to defer its sum (``gemv(defer_sum=True)``) returns its partials;
    summed by ``add_rms_norm`` (or ``SplitKPartials.total``) they give the same bits as the
    product that sums them itself followed by the same norm, for 1, 3 and MAX_ROWS rows; an
    unsplit product or one with bias returns the tensor. CPU: float32; CUDA: bfloat16. Returns
    the number of cases compared."""
    from mtpserve.kernels import gemv_triton

    with mock.patch.object(gemv_triton, "DEFER_SUM", True):   # whatever the default
        return _check_deferred_sum(device, n, k, split)


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
    real, deferred = G.gemv, []

    def counting(*a, **k):
        out = real(*a, **k)
        deferred.append(isinstance(out, G.SplitKPartials))
        return out

    logits = {}
    with (mock.patch.object(G, "gemv", counting),
          mock.patch.object(linear, "use_gemv", lambda x, w: True), torch.inference_mode()):
        ref, _ = f._run_steps(model, ids, "cpu", cfg)
        for on in (True, False):
            with mock.patch.object(G, "DEFER_SUM", on), f.triton_on_cpu("cpu", True):
                logits[on], _ = f._run_steps(model, ids, "cpu", cfg)
    assert sum(deferred) == 8, deferred      # 2 down products x (1 prefill + 3 decode steps)
    assert torch.equal(logits[True], logits[False])
    err = float((logits[True] - ref).abs().max())
    assert err <= 1e-4, err
    return {"partials_summed_by_norms": sum(deferred), "logits_abs_vs_pytorch": err}


def check_swiglu(device: str, shapes=((72, 80), (256, 64)), rows=(1, 3, 16)) -> int:
    """The SwiGLU epilogue (``gemv(swiglu=True)``) over a gate/up weight [2I, K] with rows
    interleaved (layers/activation.py), for each shape and row count: bit-equal to
    ``silu_and_mul`` of the unfused product over the checkpoint-order weight, and to the product
    over the interleaved weight then ``silu_and_mul(interleaved=True)``; close to a float64
    reference. CPU (Triton's interpreter, whose bfloat16 products are wrong): float32 inputs,
    float32 and bfloat16 outputs (the latter with CUDA's rounding of the casts), tiles of 16 x
    64 (72 rows: a last tile half full). CUDA: bfloat16 with the tiles of ``tile_config``.
    Returns the number of cases compared."""
    import fused_kernel_check as f

    with f.interpreter_rounding(device):
        return sum(_check_swiglu_shape(device, n, k, rows) for n, k in shapes)


def _check_swiglu_shape(device: str, n: int, k: int, rows) -> int:
    from mtpserve.kernels.fused_triton import silu_and_mul
    from mtpserve.kernels.gemv_triton import gemv
    from mtpserve.layers.activation import interleave_gate_up

    cpu = device == "cpu"
    dtype = torch.float32 if cpu else torch.bfloat16
    g = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=g) * 0.1).to(device, dtype)
    wi = interleave_gate_up(w)
    x = torch.randn(max(rows), k, generator=g).to(device, dtype)
    tiles = dict(block_n=16, block_k=64) if cpu else {}
    cases = 0
    for out_dtype in (torch.float32, torch.bfloat16) if cpu else (torch.bfloat16,):
        for m in rows:
            kw = dict(out_dtype=out_dtype, **tiles)
            out = gemv(x[:m], wi, swiglu=True, **kw)
            assert out.shape == (m, n // 2) and out.dtype == out_dtype
            assert torch.equal(out, silu_and_mul(gemv(x[:m], w, **kw))), (n, k, m, out_dtype)
            assert torch.equal(out, silu_and_mul(gemv(x[:m], wi, **kw), interleaved=True))
            h = x[:m].double() @ w.double().t()
            ref = torch.nn.functional.silu(h[:, : n // 2]) * h[:, n // 2:]
            assert _rel(out, ref) < (1e-5 if out_dtype == torch.float32 else 1e-2)
            cases += 1
    return cases


def check_swiglu_errors(device: str) -> int:
    """``gemv(swiglu=True)`` raises ValueError with a bias, a split reduction or an odd number
    of weight rows; ``swiglu_fits`` holds for the 8B and 1.7B gate/up shapes (SWIGLU_MIN_K 0),
    with SWIGLU_MIN_K at 4096 for the 8B one and the 135M one (not streamed at one row) only,
    never for a split one or with SWIGLU_EPILOGUE off. Returns the number
    of errors raised."""
    from mtpserve.kernels import gemv_triton
    from mtpserve.kernels.gemv_triton import gemv

    w = torch.randn(32, 300, device=device)
    x = torch.randn(2, 300, device=device)
    calls = [lambda: gemv(x, w, torch.zeros(32, device=device), swiglu=True),
             lambda: gemv(x, w, block_n=16, block_k=64, split_k=2, swiglu=True),
             lambda: gemv(x, w[:31], swiglu=True)]
    raised = 0
    for call in calls:
        try:
            call()
        except ValueError:
            raised += 1
    assert raised == len(calls), raised
    fits = gemv_triton.swiglu_fits
    shape = lambda n, k: torch.empty(n, k, device="meta")
    assert gemv_triton.SWIGLU_MIN_K == 0
    assert fits(shape(24576, 4096)) and fits(shape(12288, 2048)) and not fits(shape(1536, 2048))
    with mock.patch.object(gemv_triton, "SWIGLU_MIN_K", 4096):   # session 20-27's threshold
        assert fits(shape(24576, 4096)) and not fits(shape(12288, 2048))
        assert fits(shape(3072, 576)) and not gemv_triton.stream_fits(1, 3072, 576)   # 135M
    with mock.patch.object(gemv_triton, "SWIGLU_EPILOGUE", False):
        assert not fits(shape(12288, 2048))
    return raised


def check_silu_interleaved(device: str) -> int:
    """``silu_and_mul(interleaved=True)`` over columns (g0, u0, g1, u1, ...) bit-equal to
    ``silu_and_mul`` over (g0, g1, ..., u0, u1, ...) (float32 and bfloat16; widths whose last
    block is partial), and the layer's PyTorch fallback (``silu_and_mul_interleaved`` on the
    CPU) to ``SiluAndMul``'s. Returns the number of cases compared."""
    import fused_kernel_check as f

    from mtpserve.kernels.fused_triton import silu_and_mul
    from mtpserve.layers.activation import (SiluAndMul, deinterleave_gate_up, interleave_gate_up,
                                            silu_and_mul_interleaved)

    cases = 0
    with f.interpreter_rounding(device):
        for dtype in (torch.float32, torch.bfloat16):
            for t, n in ((1, 48), (5, 1100)):
                h = (torch.randn(t, 2 * n, generator=torch.Generator().manual_seed(n)) * 4)
                h = h.to(device, dtype)
                hi = interleave_gate_up(h.t()).t().contiguous()
                assert torch.equal(deinterleave_gate_up(hi.t()).t(), h)
                assert torch.equal(silu_and_mul(hi, interleaved=True), silu_and_mul(h))
                assert torch.equal(silu_and_mul_interleaved(hi.cpu()), SiluAndMul()(h.cpu()))
                cases += 1
    return cases


def check_interleaved_model(model_type: str = "qwen3") -> dict:
    """A tiny model (2 layers, hidden 64, intermediate 128) in float32 through the Triton path
    under the CPU interpreter, every product of at most 16 rows on the skinny product: logits of
    an 18-token prefill and of a 9-token prefill with 3 decode steps after its gate/up rows are
    interleaved (``process_weights_after_loading``), with the SwiGLU epilogue on and off,
    bit-equal to those before; the epilogue really ran (and not when off); loading weights
    again raises ValueError. ~20 s::

        TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'tests'); \\
            import gemv_check as g; print(g.check_interleaved_model())"
    """
    import fused_kernel_check as f
    from harness import tiny_hf_model

    import mtpserve.layers.activation as act
    import mtpserve.layers.linear as linear
    import mtpserve.models.llama as llama
    from mtpserve.config import ModelConfig
    from mtpserve.kernels import gemv_triton as G
    from mtpserve.models.weights import process_weights_after_loading

    hf = tiny_hf_model(model_type)
    cfg = ModelConfig.from_hf(hf.config)
    model = llama.LlamaForCausalLM(cfg, 64).eval()
    model.load_weights(hf.state_dict().items())
    ids = torch.randint(0, cfg.vocab_size, (18,), generator=torch.Generator().manual_seed(5))
    real, fused = G.gemv, []

    def counting(*a, **k):
        fused.append(k.get("swiglu", False))
        return real(*a, **k)

    def run():   # the other layers on their PyTorch paths: the interpreter is slow
        with torch.inference_mode():
            return torch.cat([f._run_steps(model, ids[:12], "cpu", cfg)[0],
                              f._run_steps(model, ids, "cpu", cfg, prefill=18)[0]])

    few_rows = lambda x, w: x.shape[0] <= G.MAX_ROWS
    with (mock.patch.multiple(G, gemv=counting,
                              SWIGLU_MIN_K=0),   # the tiny gate/up [256, 64] takes the epilogue
          mock.patch.object(linear, "use_gemv", few_rows),
          mock.patch.object(llama, "use_gemv", few_rows),
          mock.patch.object(act, "use_triton", lambda x: True)):   # the SiLU-and-mul kernels
        before = run()
        process_weights_after_loading(model)   # few_rows stands in for use_gemv there too
        assert all(layer.mlp.gate_up_interleaved for layer in model.model.layers)
        fused.clear()
        on = run()
        epilogues = sum(fused)
        fused.clear()
        with mock.patch.object(G, "SWIGLU_EPILOGUE", False):
            off = run()
        assert fused and not any(fused), fused   # products ran, none with the epilogue
    assert epilogues == 2 * 4, fused   # 2 layers x (1 prefill + 3 decode steps)
    assert torch.equal(on, before) and torch.equal(off, before)
    try:   # a checkpoint loaded again would land in the other row order
        model.load_weights(hf.state_dict().items())
        raise AssertionError("load_weights after the interleave did not raise")
    except ValueError as e:
        assert "interleaved" in str(e), e
    return {"swiglu_epilogues": epilogues, "logits": tuple(on.shape)}


def check_stream(device: str) -> float:
    """The streamed one-row product (kernels/gemv_stream_triton.py). CPU (float32): [40, 256]
    in units of 16 x 64 over 3 programs, [100, 512] in units of 8 x 512 over 7, [33, 64] in
    units of 16 x 32 over 1; CUDA (bfloat16): the 1.7B q/k/v, gate/up and down shapes and the 8B
    q/k/v shape in gemv_triton's STREAM_UNITS. Within 1e-5 (CPU) or
    1e-2 (bfloat16 output) of a float32 reference, with and without bias; the same bits for any
    number of programs and on repeat; the SwiGLU store equal to ``silu_and_mul(interleaved=True)``
    of the plain one (even n); ``gemv`` with STREAM on dispatches to it exactly where ``stream_fits``;
    more rows or chunks that do not divide K refused. Returns the worst relative error."""
    import fused_kernel_check as f

    cases = []   # the shapes checked through gemv's dispatch
    with f.interpreter_rounding(device):
        worst = max(_check_stream_shape(device, *case, cases) for case in _stream_cases(device))
    assert len(cases) == len(_stream_cases(device)), cases
    _check_stream_errors(device)
    return worst


def _stream_cases(device: str) -> list:
    """(n, k, block_n, block_k, warps, programs) for :func:`check_stream`."""
    from mtpserve.kernels import gemv_triton as gt
    from mtpserve.kernels.gemv_stream_triton import sm_count

    if device == "cpu":
        return [(40, 256, 16, 64, 4, 3), (100, 512, 8, 512, 4, 7), (33, 64, 16, 32, 4, 1)]
    cases = []
    for n, k in [(4096, 2048), (12288, 2048), (2048, 6144), (6144, 4096)]:
        unit = next(u for u in gt.STREAM_UNITS if k % u[0] == 0)
        cases.append((n, k, unit[1], unit[0], unit[2], unit[3] * sm_count(0)))
    return cases


def _check_stream_shape(device: str, n: int, k: int, bn: int, bk: int, warps: int,
                        programs: int, cases: list) -> float:
    from mtpserve.kernels import gemv_triton
    from mtpserve.kernels.fused_triton import silu_and_mul
    from mtpserve.kernels.gemv_stream_triton import gemv_stream

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=g) * 0.05).to(device, dtype)
    b = torch.randn(n, generator=g).to(device, dtype)
    x = torch.randn(1, k, generator=g).to(device, dtype)
    ref = x.float() @ w.float().t()
    kw = dict(block_n=bn, block_k=bk, num_warps=warps)
    out = gemv_stream(x, w, b, programs=programs, **kw)
    worst = max(_rel(out, ref + b.float()), _rel(gemv_stream(x, w, programs=programs, **kw), ref))
    assert worst < (1e-5 if dtype == torch.float32 else 1e-2), (n, k, worst)
    for p in (programs, 1, 5):
        assert torch.equal(out, gemv_stream(x, w, b, programs=p, **kw)), (n, k, p)
    plain = gemv_stream(x, w, programs=programs, **kw)
    assert n % 2 or torch.equal(gemv_stream(x, w, programs=programs, swiglu=True, **kw),
                       silu_and_mul(plain, interleaved=True)), (n, k)
    # preloaded tiles off, so that these small shapes stream too
    with mock.patch.multiple(gemv_triton, STREAM=True, PRELOAD=False,
                             STREAM_UNITS=((bk, bn, warps, 1),)):
        assert gemv_triton.stream_fits(1, n, k) and not gemv_triton.stream_fits(2, n, k)
        assert torch.equal(gemv_triton.gemv(x, w), gemv_stream(x, w, **kw)), (n, k)
        assert gemv_triton.gemv(x.expand(2, k), w).shape == (2, n)   # tiles, not streamed
        cases.append((n, k))
    return worst


def _check_stream_errors(device: str) -> None:
    """More rows than one, or chunks that do not divide K, raise ValueError."""
    from mtpserve.kernels.gemv_stream_triton import gemv_stream

    w = torch.zeros(32, 96, device=device)
    for x, kw in [(torch.zeros(2, 96, device=device), {}),
                  (torch.zeros(1, 96, device=device), dict(block_k=64))]:
        try:
            gemv_stream(x, w, **kw)
        except ValueError:
            continue
        raise AssertionError(f"gemv_stream took {tuple(x.shape)} {kw}")


def check_stream_fused_inputs(device: str) -> int:
    """The streamed product with its input fused in front (``gemv_stream(silu_input=True)``,
    ``NormInput``, ``GatedNormInput``). CPU (float32): [40, 256] in units of 16 x 64 and [100,
    512] in one chunk; CUDA (bfloat16): the 1.7B down (SiLU) and q/k/v (norm) shapes and the 8B
    gate/up shape (norm) in gemv_triton's units through ``gemv_fused_input``, and each with a
    Gated DeltaNet's output norm (heads of 32 in chunks of 64 on the CPU, else 128).
    SiLU-and-mul: the same bits as ``silu_and_mul`` then the product; residual add + RMSNorm:
    within 1e-5 (float32) or 1e-2 (bfloat16) of ``add_rms_norm`` then the product, the new
    residual bit-equal to add_rms_norm's; the gated norm within as much of ``gated_rms_norm``
    then the product. Returns the number of cases."""
    import fused_kernel_check as f

    from mtpserve.kernels import gemv_triton
    from mtpserve.kernels.fused_triton import add_rms_norm, gated_rms_norm, silu_and_mul
    from mtpserve.kernels.gemv_stream_triton import GatedNormInput, NormInput, gemv_stream

    cpu = device == "cpu"
    cases = ([(40, 256, dict(block_n=16, block_k=64, programs=3)),
              (100, 512, dict(block_n=8, block_k=512, programs=7))] if cpu else
             [(2048, 6144, None), (4096, 2048, None), (24576, 4096, None)])
    dtype = torch.float32 if cpu else torch.bfloat16
    done = 0
    with f.interpreter_rounding(device):
        for n, k, kw in cases:
            g = torch.Generator().manual_seed(n - k)
            w = (torch.randn(n, k, generator=g) * 0.05).to(device, dtype)
            gu = torch.randn(1, 2 * k, generator=g).to(device, dtype)
            x, res = (torch.randn(1, k, generator=g).to(device, dtype) for _ in range(2))
            nw = (torch.rand(k, generator=g) + 0.5).to(device, dtype)

            def product(inp, **more):   # a NormInput takes all K in one chunk, a gated one not
                if kw is not None:
                    one = dict(kw, block_k=k) if isinstance(inp, NormInput) else kw
                    return gemv_stream(inp, w, **one, **more)
                return gemv_triton.gemv_fused_input(inp, w, **more)

            def plain(inp):   # the same units without the fused input
                return gemv_stream(inp, w, **kw) if kw is not None else gemv_triton.gemv(inp, w)

            if cpu or gemv_triton.fused_input_fits(gu, w, norm=False):
                want = plain(silu_and_mul(gu))
                assert torch.equal(product(gu, silu_input=True), want), (n, k)
                done += 1
            if cpu or gemv_triton.fused_input_fits(x, w, norm=True):
                ro = torch.empty_like(x)
                got = product(NormInput(x, res, nw, 1e-6, ro))
                h, s = add_rms_norm(x, res, nw, 1e-6, False)
                want = plain(h)
                assert torch.equal(ro, s), (n, k)
                assert _rel(got, want) < (1e-5 if cpu else 1e-2), (n, k, _rel(got, want))
                done += 1
            d = 32 if kw is not None and kw["block_k"] == 64 else 128
            if cpu or gemv_triton.gated_norm_fits(x, w, d):
                z = torch.randn(1, k, generator=g).to(device, dtype)
                gw = (torch.rand(d, generator=g) + 0.5).to(device, dtype)
                got = product(GatedNormInput(x, z, gw, 1e-6))
                want = plain(gated_rms_norm(x.view(1, -1, d), z.view(1, -1, d), gw,
                                            1e-6).view(1, k))
                assert _rel(got, want) < (1e-5 if cpu else 1e-2), (n, k, _rel(got, want))
                done += 1
        if cpu:   # bfloat16, where its three roundings show: the same bits as the two kernels
            done += _check_gated_norm_bits()
    return done


def _check_gated_norm_bits() -> int:
    """Under the interpreter (its float32 -> bfloat16 casts rounded as on CUDA): the streamed
    product taking a Gated DeltaNet's output norm in front, in bfloat16 over heads of 32 in
    chunks of 64 (several chunks and programs), bit-equal to ``gated_rms_norm`` then the same
    streamed product; a strided norm weight is taken as its values. Returns 1."""
    from mtpserve.kernels.fused_triton import gated_rms_norm
    from mtpserve.kernels.gemv_stream_triton import GatedNormInput, gemv_stream

    g, bf = torch.Generator().manual_seed(11), torch.bfloat16
    w = (torch.randn(40, 256, generator=g) * 0.05).to(bf)
    x, z = (torch.randn(1, 256, generator=g).to(bf) for _ in range(2))
    gw = (torch.rand(64, generator=g) + 0.5).to(bf)[::2]        # strided: 32 values
    unit = dict(block_n=16, block_k=64, programs=3)
    got = gemv_stream(GatedNormInput(x, z, gw, 1e-6), w, **unit)
    normed = gated_rms_norm(x.view(1, 8, 32), z.view(1, 8, 32), gw.contiguous(), 1e-6)
    assert torch.equal(got, gemv_stream(normed.view(1, 256), w, **unit))
    return 1

