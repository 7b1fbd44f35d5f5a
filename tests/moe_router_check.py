"""Checks of the MoE routing kernel (kernels/moe_router_triton.py) and of SparseMoeBlock's CUDA
path, for any device: ``"cuda"`` (tests/test_gpu.py), or ``"cpu"`` under Triton's interpreter
(tests/test_moe_router.py runs this in a subprocess)::

    TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'tests'); \\
        import moe_router_check as m; m.check_route('cpu'); m.check_block('cpu')"

The reference routing (:func:`route_ref`) is PyTorch's: float32 softmax, the experts ordered by
decreasing logit with equal logits in increasing index order (a stable sort), the top k taken,
renormalised when asked. Ids must match exactly; float32 weights within 1e-6; weights rounded to
bfloat16 within one bfloat16 ulp of the rounded reference. Each check raises AssertionError on a
mismatch and returns the worst errors it measured.
"""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import torch

F32_TOL = 1e-6


def route_ref(logits: torch.Tensor, top_k: int, renormalize: bool, shared_gate: bool = False,
              out_dtype: torch.dtype | None = None):
    """The routing in PyTorch on the CPU: (ids [T, k] int64, weights [T, k], gate [T, 1] or
    None), weights and gate in ``out_dtype`` (default the logits' dtype)."""
    out_dtype = out_dtype or logits.dtype
    E = logits.shape[1] - int(shared_gate)
    lf = logits[:, :E].float().cpu()
    probs = torch.softmax(lf, dim=-1)
    ids = torch.sort(lf, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = probs.gather(1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    gate = torch.sigmoid(logits[:, E:].float().cpu()).to(out_dtype) if shared_gate else None
    return ids, w.to(out_dtype), gate


def tied_logits(T: int, E: int, top_k: int, seed: int) -> torch.Tensor:
    """[T, E] random logits, the first rows with exact ties (values exact in bfloat16): row 0
    constant; row 1 three experts tied at the top and a group of k tied across the k-th place
    (the k - 3 of lowest index taken); row 2 all but two experts tied."""
    g = torch.Generator().manual_seed(seed)
    lg = torch.randn(T, E, generator=g)
    if T > 0:
        lg[0] = 0.5
    if T > 1:
        lg[1] = torch.rand(E, generator=g) - 1.0          # all below the tied groups
        top = torch.tensor([E - 1, 5, 30 % E])
        rest = torch.randperm(E, generator=g)
        rest = rest[~torch.isin(rest, top)][:top_k]        # 3 + k tied: k - 3 taken, 3 not
        lg[1, top] = 3.0
        lg[1, rest] = 2.0
    if T > 2:
        lg[2] = -1.25
        lg[2, [E // 2, 3]] = 0.75
    return lg


def _ulp_bf16(a: torch.Tensor, b: torch.Tensor) -> int:
    ia = a.cpu().contiguous().view(torch.int16).long()
    ib = b.cpu().contiguous().view(torch.int16).long()
    return int((ia - ib).abs().max()) if a.numel() else 0   # weights are >= 0: no sign flips


def _compare(route, logits, k, renorm, shared, dtype, worst) -> None:
    ref_ids, ref_w, ref_gate = route_ref(logits, k, renorm, shared, torch.float32)
    ids, w, gate = route(logits, k, renorm, shared_gate=shared, out_dtype=torch.float32)
    assert ids.dtype == torch.int64 and ids.shape == ref_ids.shape
    assert torch.equal(ids.cpu(), ref_ids), (ids.cpu(), ref_ids)
    err = (w.cpu() - ref_w).abs().max().item()
    worst["weights f32"] = max(worst.get("weights f32", 0.0), err)
    assert err <= F32_TOL, err
    if shared:
        gerr = (gate.cpu() - ref_gate).abs().max().item()
        worst["gate f32"] = max(worst.get("gate f32", 0.0), gerr)
        assert gate.shape == (logits.shape[0], 1) and gerr <= F32_TOL, gerr
        # the shared expert as choice k + 1: the same k choices, then (E, the same gate)
        ids_a, w_a, gate_a = route(logits, k, renorm, shared_gate=True,
                                   out_dtype=torch.float32, append_shared=True)
        E = logits.shape[1] - 1
        assert ids_a.shape == w_a.shape == (logits.shape[0], k + 1)
        assert torch.equal(ids_a[:, :k], ids) and torch.equal(w_a[:, :k], w)
        assert bool((ids_a[:, k] == E).all()) and torch.equal(w_a[:, k:], gate)
        assert gate_a.data_ptr() == w_a[:, k:].data_ptr()
        worst["appended shared"] = worst.get("appended shared", 0) + 1
    else:
        assert gate is None
    if dtype != torch.float32:                           # weights rounded to the model dtype
        _, rw, rg = route_ref(logits, k, renorm, shared, dtype)
        ids2, w2, g2 = route(logits, k, renorm, shared_gate=shared, out_dtype=dtype)
        assert torch.equal(ids2.cpu(), ref_ids) and w2.dtype == dtype
        u = _ulp_bf16(w2, rw)
        worst["weights ulp"] = max(worst.get("weights ulp", 0), u)
        assert u <= 1, u
        if shared:
            assert _ulp_bf16(g2, rg) <= 1


def check_route(device, dtypes=(torch.float32,)) -> dict:
    """``route`` against :func:`route_ref` for E in {64, 512}, k in {8, 10}, T in {1, 5, 64},
    with and without renormalising and the shared gate column, tied rows included, logits in
    each of ``dtypes``; also strided logits, the other rows-per-program layout, a NaN row (ids
    stay inside [0, E)), the errors raised, and on CUDA a replay of a captured CUDA graph."""
    from mtpserve.kernels.moe_router_triton import route

    worst: dict = {}
    case = 0
    for dtype in dtypes:
        for E in (64, 512):
            for k in (8, 10):
                for T in (1, 5, 64):
                    for renorm in (False, True):
                        case += 1
                        shared = case % 2 == 0
                        lg = tied_logits(T, E, k, case)
                        if shared:
                            gl = torch.randn(T, 1, generator=torch.Generator().manual_seed(case))
                            lg = torch.cat([lg, 3 * gl], 1)
                        logits = lg.to(device, dtype)
                        _compare(route, logits, k, renorm, shared, dtype, worst)
        # strided rows (a slice of a wider product) and the other program layout
        wide = torch.randn(5, 600, generator=torch.Generator().manual_seed(7)).to(device, dtype)
        sl = wide[:, :513]
        for rows in (1, 4):
            ids, w, gate = route(sl, 10, True, shared_gate=True, out_dtype=torch.float32,
                                 rows_per_program=rows)
            ref_ids, ref_w, ref_gate = route_ref(sl, 10, True, True, torch.float32)
            assert torch.equal(ids.cpu(), ref_ids)
            assert (w.cpu() - ref_w).abs().max().item() <= F32_TOL
            assert (gate.cpu() - ref_gate).abs().max().item() <= F32_TOL
    bad = torch.randn(3, 64).to(device)
    bad[1, 7] = float("nan")
    ids, _, _ = route(bad, 8, True)
    assert int(ids.min()) >= 0 and int(ids.max()) < 64
    for args, kw in (((bad[0], 2), {}), ((bad, 0), {}), ((bad, 65), {}),
                     ((bad, 64), dict(shared_gate=True)), ((bad, 2), dict(rows_per_program=3)),
                     ((bad.long(), 2), {}), ((bad, 2), dict(append_shared=True))):
        try:
            route(*args, **kw)
        except ValueError:
            continue
        raise AssertionError(f"route{args[0].shape, args[1:], kw} did not raise")
    if torch.device(device).type == "cuda":
        _check_route_graph(route, worst)
    return worst


def _check_route_graph(route, worst) -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 513, generator=g).cuda()
    route(logits, 10, True, shared_gate=True)                  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, w, gate = route(logits, 10, True, shared_gate=True)
    new = torch.cat([tied_logits(4, 512, 10, 11), torch.full((4, 1), -0.5)], 1)
    logits.copy_(new)
    graph.replay()
    ref_ids, ref_w, ref_gate = route_ref(new, 10, True, True)
    assert torch.equal(ids.cpu(), ref_ids)
    err = (w.cpu() - ref_w).abs().max().item()
    worst["graph weights f32"] = err
    assert err <= F32_TOL and (gate.cpu() - ref_gate).abs().max().item() <= F32_TOL


# ---- the whole block ----------------------------------------------------------------------------
def block_cfg(E: int, k: int, renorm: bool = True, hidden: int = 64, shared: int = 48):
    """A SparseMoeBlock config: expert width 32, the shared expert ``shared`` wide (32: folded
    into the experts' tensors, run as one more choice on the Triton path)."""
    hf = SimpleNamespace(num_experts=E, num_experts_per_tok=k, norm_topk_prob=renorm,
                         moe_intermediate_size=32, shared_expert_intermediate_size=shared)
    return SimpleNamespace(hidden_size=hidden, hf_config=hf)


def block_weights(cfg, seed: int) -> list[tuple[str, torch.Tensor]]:
    """Checkpoint-named random float32 tensors of a SparseMoeBlock (fused expert layout)."""
    g = torch.Generator().manual_seed(seed)
    hf, H = cfg.hf_config, cfg.hidden_size
    E, I, S = hf.num_experts, hf.moe_intermediate_size, hf.shared_expert_intermediate_size

    def rnd(*shape, std=0.1):
        return torch.randn(*shape, generator=g) * std

    return [("gate.weight", rnd(E, H, std=0.3)), ("shared_expert_gate.weight", rnd(1, H)),
            ("experts.gate_up_proj", rnd(E, 2 * I, H)), ("experts.down_proj", rnd(E, H, I)),
            ("shared_expert.gate_proj.weight", rnd(S, H)),
            ("shared_expert.up_proj.weight", rnd(S, H)),
            ("shared_expert.down_proj.weight", rnd(H, S))]


def _load(block, weights, dtype) -> None:
    from mtpserve.models.weights import check_all_loaded, load_weights

    loaded = load_weights(block, [(n, t.to(dtype)) for n, t in weights])
    check_all_loaded(block, loaded)


@contextlib.contextmanager
def _triton_moe_on_cpu(device):
    """On the CPU (under TRITON_INTERPRET=1): layers/moe.py takes its Triton path."""
    if torch.device(device).type != "cpu":
        yield
        return
    from mtpserve.layers import moe

    saved = moe.use_triton
    moe.use_triton = lambda x: True
    try:
        yield
    finally:
        moe.use_triton = saved


def _rel(a, b) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).norm() / b.norm()).item()


def check_block(device, dtypes=(torch.float32,), rows=(1, 5, 37)) -> dict:
    """SparseMoeBlock through its Triton path on ``device`` against the same block's PyTorch path
    on the CPU in float32 (weights and inputs rounded to the dtype first): relative error within
    1e-5 (float32) or 2e-2 (bfloat16) for each row count (on CUDA up to 16 rows take the skinny
    product). Blocks: built on the device (on CUDA the router merges at construction and the
    checkpoint loads through the views) and moved there with ``.to()`` (merged again), E=64 k=8
    without renormalising, E=512 k=10 with; on CUDA also a captured CUDA graph replayed with new
    inputs and the merged storage after a dtype round trip; on the CPU the block merged by hand
    and the unmerged two-product path. E=64's shared expert is as wide as an expert (folded
    into the experts' row E: the merged blocks run it as a (k+1)-th choice), E=512's is not."""
    from mtpserve.layers.moe import SparseMoeBlock

    cuda = torch.device(device).type == "cuda"
    worst: dict = {}
    for E, k, renorm, shared in ((64, 8, False, 32), (512, 10, True, 48)):
        cfg = block_cfg(E, k, renorm, shared=shared)
        weights = block_weights(cfg, E + k)
        for dtype in dtypes:
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            ref = SparseMoeBlock(cfg)
            _load(ref, [(n, t.to(dtype)) for n, t in weights], torch.float32)
            prev = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                with torch.device(device):
                    built = SparseMoeBlock(cfg)
            finally:
                torch.set_default_dtype(prev)
            _load(built, weights, dtype)
            moved = copy.deepcopy(ref).to(device, dtype)
            blocks = {"built": built, "moved": moved}
            for b in blocks.values():   # a shared expert as wide as an expert: row E holds it
                _check_folded(b, weights, dtype, folded=shared == 32)
            if cuda:
                for b in blocks.values():
                    w = b._merged_router()
                    assert w is not None and w.shape == (E + 1, cfg.hidden_size)
                    assert torch.equal(w[:E].cpu(), ref.gate.weight.to(dtype).cpu())
                    assert torch.equal(w[E:].cpu(), ref.shared_expert_gate.weight.to(dtype).cpu())
            else:
                built.merge_router_weights()          # moved: the unmerged fallback path
                assert moved._merged_router() is None
            g = torch.Generator().manual_seed(E)
            with torch.inference_mode():
                for T in rows:
                    x = torch.randn(T, cfg.hidden_size, generator=g).to(dtype)
                    want = ref(x.float())
                    for name, b in blocks.items():
                        with _triton_moe_on_cpu(device):
                            out = b(x.to(device))
                        assert out.dtype == dtype and out.shape == x.shape
                        e = _rel(out, want)
                        key = f"block {name} {str(dtype)[6:]} T={T}"
                        worst[key] = max(worst.get(key, 0.0), e)
                        assert e < tol, (E, k, T, name, dtype, e)
                if cuda:
                    _check_block_graph(built, ref, dtype, tol, g, worst)
    if cuda:
        _check_round_trip()
    return worst


def _check_folded(block, weights, dtype, folded: bool) -> None:
    """The shared expert's weights are views of the experts' row E holding the checkpoint's
    values (gate rows, then up rows), or, unfolded, the experts hold only E rows."""
    E, w = block.num_experts, dict(weights)
    gu, down = block.experts.gate_up_proj, block.experts.down_proj
    assert gu.shape[0] == down.shape[0] == E + int(folded) and block._runs_folded() == folded
    if not folded:
        return
    want_gu = torch.cat([w["shared_expert.gate_proj.weight"], w["shared_expert.up_proj.weight"]])
    assert torch.equal(gu[E].cpu(), want_gu.to(dtype))
    assert torch.equal(down[E].cpu(), w["shared_expert.down_proj.weight"].to(dtype))
    assert block.shared_expert.gate_up_proj.weight.data_ptr() == gu[E].data_ptr()
    assert block.shared_expert.down_proj.weight.data_ptr() == down[E].data_ptr()


def _check_block_graph(block, ref, dtype, tol, g, worst) -> None:
    x = torch.randn(4, ref.gate.in_features, generator=g).to("cuda", dtype)
    block(x)                                          # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = block(x)
    new = torch.randn(4, ref.gate.in_features, generator=g).to(dtype)
    x.copy_(new)
    graph.replay()
    e = _rel(out, ref(new.float()))
    worst[f"block graph {str(dtype)[6:]}"] = e
    assert e < tol, e


def _check_round_trip() -> None:
    """CUDA: float32 -> bfloat16 -> CPU -> CUDA keeps the block merged on CUDA (and unmerged on
    the CPU) with the values of the parameters."""
    from mtpserve.layers.moe import SparseMoeBlock

    cfg = block_cfg(64, 8)
    b = SparseMoeBlock(cfg)
    _load(b, block_weights(cfg, 1), torch.float32)
    want = torch.cat([b.gate.weight, b.shared_expert_gate.weight]).bfloat16()
    b.cuda()
    assert b._merged_router() is not None and b._merged_router().dtype == torch.float32
    b.bfloat16()
    assert torch.equal(b._merged_router().cpu(), want)
    b.cpu()
    assert b._merged_router() is None and b._router is None
    b.cuda()
    assert torch.equal(b._merged_router().cpu(), want)


def check_combine(device) -> dict:
    """kernels/moe_combine_triton.py ``moe_combine`` against PyTorch's ``addcmul(y.view(T, k,
    H).sum(1), shared, gate)`` for T in {1, 3}, k in {8, 10}, H 300 (a partial last block):
    bfloat16 within one ulp of each value, float32 within 1e-6 of the largest. Returns the worst
    (ulps for bfloat16, relative for float32)."""
    from fused_kernel_check import interpreter_rounding, rel_to_max, ulp_distance
    from mtpserve.kernels.moe_combine_triton import moe_combine

    worst = {}
    g = torch.Generator().manual_seed(2)
    with interpreter_rounding(device):
        for dtype in (torch.float32, torch.bfloat16):
            for T, k in ((1, 8), (3, 10)):
                y, shared = (torch.randn(T * k, 300, generator=g).to(dtype),
                             torch.randn(T, 300, generator=g).to(dtype))
                gate = torch.rand(T, 1, generator=g).to(dtype)
                want = torch.addcmul(y.view(T, k, 300).sum(1), shared, gate)
                got = moe_combine(y.to(device), shared.to(device), gate.to(device)).cpu()
                key = f"combine {str(dtype)[6:]}"
                e = ulp_distance(got, want) if dtype == torch.bfloat16 else rel_to_max(got, want)
                worst[key] = max(worst.get(key, 0), e)
                assert e <= (1 if dtype == torch.bfloat16 else 1e-6), (T, k, dtype, e)
    return worst


def check_deferred_sum(device, dtypes=(torch.float32,)) -> dict:
    """A folded block (shared expert as wide as an expert, router merged) left to the next norm
    (``defer_sum=True``: split partials) against its own combine kernel then the norm's
    residual add: the same bits, in each of ``dtypes``, for 1 and 4 tokens; at 9 tokens (72
    routed rows: sorted by expert) the block runs unfolded and returns a tensor. Returns the
    number of cases compared."""
    from fused_kernel_check import interpreter_rounding, triton_on_cpu
    from mtpserve.layers.norm import RMSNorm

    cfg = block_cfg(64, 8, shared=32)
    weights = block_weights(cfg, 3)
    g = torch.Generator().manual_seed(5)
    cases = 0
    with interpreter_rounding(device), triton_on_cpu(device, attention=False, hybrid=True):
        for dtype in dtypes:
            block = copy.deepcopy(_loaded_block(cfg, weights)).to(device, dtype)
            block.merge_router_weights()
            norm = RMSNorm(cfg.hidden_size, 1e-6, zero_centered=True).to(device, dtype)
            with torch.no_grad():
                norm.weight.copy_(torch.randn(cfg.hidden_size, generator=g) * 0.2)
            with torch.inference_mode():
                for T in (1, 4, 9):
                    x = torch.randn(T, cfg.hidden_size, generator=g).to(device, dtype)
                    res = torch.randn(T, cfg.hidden_size, generator=g).to(device, dtype)
                    parts = block(x, defer_sum=True)
                    assert hasattr(parts, "total") == (T * 8 <= 64), (T, type(parts))
                    want = norm.add_norm(block(x), res)
                    got = norm.add_norm(parts, res)
                    assert all(torch.equal(a, b) for a, b in zip(got, want)), (dtype, T)
                    assert torch.equal(block(x), parts.total() if T < 9 else parts)
                    cases += 1
    return cases


def _loaded_block(cfg, weights):
    from mtpserve.layers.moe import SparseMoeBlock

    block = SparseMoeBlock(cfg)
    _load(block, weights, torch.float32)
    return block
