"""Checks of the persistent SwiGLU MLP kernel (kernels/mlp_triton.py) for any device: ``"cuda"``
(tests/test_gpu.py, bfloat16, one launch with the grid barrier) or ``"cpu"`` under Triton's
interpreter (tests/test_mlp_kernel.py, float32, the two phases as two launches)::

    TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'tests'); \\
        import mlp_check as c; print(c.check_swiglu_mlp('cpu'))"

Raises AssertionError on a mismatch; returns the number of cases compared.
"""

from __future__ import annotations

import torch

# (K inputs, I intermediate, N outputs): CPU a small MLP whose down product splits in two;
# CUDA the Qwen3-1.7B and Qwen3-8B MLPs
CPU_SHAPES = ((64, 256, 40),)
CUDA_SHAPES = ((2048, 6144, 2048), (4096, 12288, 4096))


def check_swiglu_mlp(device: str, shapes=None, rows=(1, 3, 16), progs: int | None = None) -> int:
    """For each shape and row count: ``swiglu_mlp``'s partials are bit-equal to the skinny
    product's with the same tiles (``gemv(swiglu=True)`` over the interleaved weight, then
    ``gemv(defer_sum=True)``), their sum is within 1e-2 (bf16) / 1e-5 (float32) of a float64
    reference, a row's bits do not depend on the rows beside it, and the barrier's counters are
    zero afterwards. CPU programs: 3 (several items a program)."""
    from mtpserve.kernels import gemv_triton, grid_barrier, mlp_triton

    saved = gemv_triton.DEFER_SUM
    gemv_triton.DEFER_SUM = True
    try:
        cases = 0
        for k, i, n in shapes or (CPU_SHAPES if device == "cpu" else CUDA_SHAPES):
            cases += _check_shape(device, k, i, n, rows, progs or (3 if device == "cpu" else None))
        assert int(grid_barrier.counters(torch.device(device)).abs().sum()) == 0
        return cases
    finally:
        gemv_triton.DEFER_SUM = saved


def _check_shape(device: str, k: int, i: int, n: int, rows, progs: int | None) -> int:
    from mtpserve.kernels import mlp_triton
    from mtpserve.kernels.gemv_triton import MAX_ROWS, gemv
    from mtpserve.layers.activation import interleave_gate_up

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(k * i + n)
    w_gu = (torch.randn(2 * i, k, generator=g) * k ** -0.5).to(device, dtype)
    w_d = (torch.randn(n, i, generator=g) * i ** -0.5).to(device, dtype)
    x = torch.randn(MAX_ROWS, k, generator=g).to(device, dtype)
    wi = interleave_gate_up(w_gu)
    full = mlp_triton.swiglu_mlp(x, wi, w_d, progs=progs)
    cfg = mlp_triton.last_plan[(2 * i, k, n)][1]
    gu = x.double() @ w_gu.double().t()
    ref = (torch.nn.functional.silu(gu[:, :i]) * gu[:, i:]) @ w_d.double().t()
    err = ((full.total().double() - ref).norm() / ref.norm()).item()
    assert err < (1e-5 if dtype == torch.float32 else 1e-2), (k, i, n, err)
    for m in rows:
        out = mlp_triton.swiglu_mlp(x[:m], wi, w_d, progs=progs)
        h = gemv(x[:m], wi, swiglu=True, block_n=cfg["a_block_n"], block_k=cfg["a_block_k"])
        want = gemv(h, w_d, block_n=cfg["b_block_n"], block_k=cfg["b_block_k"],
                    split_k=cfg["b_split"], defer_sum=True)
        want = want.parts if hasattr(want, "parts") else want.float()[None]
        assert out.parts.shape == want.shape, (k, i, n, m, out.parts.shape, want.shape)
        assert torch.equal(out.parts, want), (k, i, n, m)
        assert torch.equal(out.parts, full.parts[:, :m]), (k, i, n, m)
    return len(rows)


def check_graph_replay(k: int = 2048, i: int = 6144, n: int = 2048, replays: int = 5) -> int:
    """CUDA: ``swiglu_mlp`` of one row captured in a CUDA graph and replayed ``replays`` times,
    new inputs copied in before each, gives the eager partials bit for bit each time (the
    barrier's counters are back at zero after every launch). Returns the replays compared."""
    from mtpserve.kernels import grid_barrier, mlp_triton
    from mtpserve.layers.activation import interleave_gate_up

    g = torch.Generator().manual_seed(7)
    w_gu = interleave_gate_up((torch.randn(2 * i, k, generator=g) * k ** -0.5).cuda().bfloat16())
    w_d = (torch.randn(n, i, generator=g) * i ** -0.5).cuda().bfloat16()
    x = torch.zeros(1, k, device="cuda", dtype=torch.bfloat16)
    mlp_triton.swiglu_mlp(x, w_gu, w_d)   # compiled outside the capture
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = mlp_triton.swiglu_mlp(x, w_gu, w_d)
    for r in range(replays):
        x.copy_(torch.randn(1, k, generator=g).bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.parts, mlp_triton.swiglu_mlp(x, w_gu, w_d).parts), r
        assert int(grid_barrier.counters(x.device).abs().sum()) == 0, r
    return replays


def check_persistent_model(model_type: str = "qwen3") -> int:
    """A tiny model (2 layers, hidden 64, intermediate 128) in float32 under the CPU interpreter,
    every product of at most 16 rows on the skinny product: with ``mlp_triton.ENABLED`` its
    gate/up rows are interleaved at load, each MLP of a 9-token prefill and its 3 decode steps
    runs the persistent kernel (counted; the 18-token prefill, over MAX_ROWS, does not), and
    the logits of both are within
    1e-5 of those of the separate kernels before the interleave. Returns the kernels counted."""
    import fused_kernel_check as f
    from harness import tiny_hf_model

    import mtpserve.layers.linear as linear
    import mtpserve.models.llama as llama
    from mtpserve.config import ModelConfig
    from mtpserve.kernels import mlp_triton as P
    from mtpserve.models.weights import process_weights_after_loading

    hf = tiny_hf_model(model_type)
    cfg = ModelConfig.from_hf(hf.config)
    model = llama.LlamaForCausalLM(cfg, 64).eval()
    model.load_weights(hf.state_dict().items())
    ids = torch.randint(0, cfg.vocab_size, (18,), generator=torch.Generator().manual_seed(5))
    saved = P.swiglu_mlp, P.ENABLED, linear.use_gemv, llama.use_gemv
    calls = []

    def counting(*a, **k):
        calls.append(a[0].shape[0])
        return saved[0](*a, **k)

    def run():   # the other layers on their PyTorch paths: the interpreter is slow
        with torch.inference_mode():
            return torch.cat([f._run_steps(model, ids[:12], "cpu", cfg)[0],
                              f._run_steps(model, ids, "cpu", cfg, prefill=18)[0]])

    few_rows = lambda x, w: x.shape[0] <= 16
    linear.use_gemv, llama.use_gemv = few_rows, few_rows
    try:
        before = run()
        P.swiglu_mlp, P.ENABLED = counting, True
        process_weights_after_loading(model)   # few_rows stands in for use_gemv there too
        assert all(layer.mlp.gate_up_interleaved for layer in model.model.layers)
        on = run()
    finally:
        P.swiglu_mlp, P.ENABLED, linear.use_gemv, llama.use_gemv = saved
    assert sorted(calls) == [1] * 6 + [9, 9], calls   # 2 layers x (9-token prefill + 3 steps)
    err = ((on - before).norm() / before.norm()).item()
    assert err < 1e-5, err
    return len(calls)
