"""Checks of the sort by expert in one Triton kernel (``align_by_expert_triton`` in
kernels/fused_moe_triton.py) for any device: ``"cuda"`` (tests/test_gpu.py), or ``"cpu"`` under
Triton's interpreter (tests/test_moe_align.py runs this in a subprocess)::

    TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'tests'); \\
        import moe_align_check as m; print(m.check_align('cpu'))"

The reference is ``align_by_expert_torch`` (PyTorch ops, on the CPU): ``rows`` and
``block_expert`` must be equal to it (``torch.equal``). The reference itself is checked against
the layout's definition (:func:`check_layout`). Each check raises AssertionError on a mismatch.
"""

from __future__ import annotations

import torch

# the block sizes fused_experts takes (_block_m)
BLOCK_MS = (16, 64)


def routed_ids(T: int, k: int, E: int, seed: int) -> torch.Tensor:
    """[T, k] int64: k distinct random experts per token (as a router picks them)."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(T, E, generator=g).topk(k, dim=1).indices


def cases(seed: int = 0):
    """(name, ids [T, k] int64 on the CPU, num_experts, block_m, (rows per program, ids per
    counting step) or None for the defaults) for the kernel's
    edge cases: one row, less than a chunk, exact chunks and a partial last one, experts with no
    rows (first, last, most), every row to one expert, E not a power of two, E = 64 top 8 and
    E = 512 top 10 (Qwen3-Next), each block size of ``_block_m``."""
    g = torch.Generator().manual_seed(seed)
    out = [("one row", torch.tensor([[3]]), 8, 16, None),
           ("below a chunk", routed_ids(5, 2, 64, seed), 64, 16, None),
           ("exact chunks", routed_ids(64, 4, 16, seed + 1), 16, 64, None),
           ("above a chunk", routed_ids(150, 4, 16, seed + 2), 16, 64, None),
           ("small chunks", routed_ids(41, 3, 8, seed + 3), 8, 16, (4, 16)),
           ("E=64 k=8", routed_ids(37, 8, 64, seed + 4), 64, 64, None),
           ("E=512 k=10 small", routed_ids(6, 10, 512, seed + 5), 512, 16, None),
           ("E=512 k=10", routed_ids(40, 10, 512, seed + 6), 512, 64, None),
           ("E=60", torch.randint(0, 60, (70, 3), generator=g), 60, 16, (32, 64)),
           ("E=2", torch.randint(0, 2, (33, 1), generator=g), 2, 64, None)]
    sparse = torch.tensor([0, 5, 63])[torch.randint(0, 3, (90, 2), generator=g)]
    out.append(("three experts of 64", sparse, 64, 16, (64, 32)))
    mid = torch.randint(10, 20, (50, 4), generator=g)       # first and last experts empty
    out.append(("middle experts", mid, 32, 64, None))
    for e in (0, 7, 63):
        out.append((f"all to expert {e}", torch.full((75, 4), e), 64, 64, None))
    out.append(("all to one, block 16", torch.full((9, 2), 5), 64, 16, (8, 8)))
    return out


def check_layout(rows: torch.Tensor, block_expert: torch.Tensor, ids: torch.Tensor,
                 num_experts: int, block_m: int) -> None:
    """The layout by its definition: every flat index once; each block's real rows name the
    block's expert, in increasing flat order inside each expert; experts in increasing order;
    blocks of -1 all padding and after the others; R as ``padded_rows``."""
    from mtpserve.kernels.fused_moe_triton import padded_rows

    flat, n = ids.flatten(), ids.numel()
    assert rows.numel() == padded_rows(n, num_experts, block_m)
    assert block_expert.numel() * block_m == rows.numel()
    real = rows[rows < n]
    assert torch.equal(real.sort().values, torch.arange(n))
    be = block_expert.repeat_interleave(block_m)
    assert torch.equal(be[rows < n], flat[real])
    assert (rows <= n).all() and (block_expert >= -1).all()
    used = block_expert[block_expert >= 0]
    assert torch.equal(block_expert[:used.numel()], used) and (used.diff() >= 0).all()
    assert (rows[used.numel() * block_m:] == n).all()
    for e in used.unique().tolist():
        mine = real[flat[real] == e]
        assert (mine.diff() > 0).all()


def _equal(got, ids, num_experts, block_m, name) -> None:
    from mtpserve.kernels.fused_moe_triton import align_by_expert_torch

    want = align_by_expert_torch(ids.cpu(), num_experts, block_m)
    for a, b, what in zip(got, want, ("rows", "block_expert")):
        assert a.dtype == torch.int64, (name, what, a.dtype)
        assert torch.equal(a.cpu(), b), (name, what, a.cpu().tolist(), b.tolist())


def check_align(device, random_sizes=()) -> dict:
    """``align_by_expert_triton`` equal to ``align_by_expert_torch`` for each of :func:`cases`
    (and each (T, k, E) of ``random_sizes`` with routed random ids, both block sizes), the
    reference itself checked by :func:`check_layout`; an empty ``ids``; the errors raised.
    Returns {case name: padded rows R}."""
    from mtpserve.kernels.fused_moe_triton import align_by_expert_torch, align_by_expert_triton

    seen = {}
    todo = list(cases())
    for i, (T, k, E) in enumerate(random_sizes):
        for bm in BLOCK_MS:
            todo.append((f"random T={T} k={k} E={E} bm={bm}", routed_ids(T, k, E, 100 + i), E,
                         bm, None))
    for name, ids, E, bm, tiles in todo:
        check_layout(*align_by_expert_torch(ids, E, bm), ids, E, bm)
        got = align_by_expert_triton(ids.to(device), E, bm, *(tiles or ()))
        _equal(got, ids, E, bm, name)
        seen[name] = got[0].numel()
    rows, be = align_by_expert_triton(torch.empty(0, 4, dtype=torch.int64, device=device), 64, 16)
    assert rows.numel() == 0 and be.numel() == 0
    ids = torch.zeros(2, 2, dtype=torch.int64, device=device)
    for args in ((ids[0], 8, 16), (ids.float(), 8, 16), (ids, 0, 16), (ids, 2048, 16),
                 (ids, 8, 24), (ids, 8, 16, 3), (ids, 8, 16, 64, 100)):
        try:
            align_by_expert_triton(*args)
        except ValueError:
            continue
        raise AssertionError(f"align_by_expert_triton{args[1:]} did not raise")
    return seen


def check_dispatch(device) -> dict:
    """``align_by_expert`` takes the kernel up to ``ALIGN_KERNEL_MAX_ROWS`` rows and the PyTorch
    ops above (the limit lowered here to keep the check small), with equal outputs either way."""
    from mtpserve.kernels import fused_moe_triton as fm

    calls = []
    kernel, saved = fm.align_by_expert_triton, fm.ALIGN_KERNEL_MAX_ROWS
    fm.align_by_expert_triton = lambda *a, **kw: calls.append(a[0].numel()) or kernel(*a, **kw)
    fm.ALIGN_KERNEL_MAX_ROWS = 200
    try:
        for T in (50, 51):                                # 200 and 204 rows
            ids = routed_ids(T, 4, 64, T)
            _equal(fm.align_by_expert(ids.to(device), 64, 64), ids, 64, 64, f"dispatch T={T}")
    finally:
        fm.align_by_expert_triton, fm.ALIGN_KERNEL_MAX_ROWS = kernel, saved
    assert calls == [200], calls
    return {"kernel calls": calls}


def check_graph() -> None:
    """CUDA: the kernel captured in a CUDA graph and replayed with other ids."""
    from mtpserve.kernels.fused_moe_triton import align_by_expert_triton

    ids = routed_ids(100, 10, 512, 1).cuda()
    align_by_expert_triton(ids, 512, 64)                  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = align_by_expert_triton(ids, 512, 64)
    new = routed_ids(100, 10, 512, 2)
    ids.copy_(new)
    graph.replay()
    _equal(got, new, 512, 64, "graph replay")


def _random_experts(E: int, H: int, I: int, g: torch.Generator):
    """A float32 ``FusedExperts`` of E experts (hidden H, width I), weights N(0, 0.2) from g."""
    from mtpserve.layers.moe import FusedExperts

    fe = FusedExperts(E, H, I)
    fe.gate_up_proj.data.normal_(0, 0.2, generator=g)
    fe.down_proj.data.normal_(0, 0.2, generator=g)
    return fe


def check_fused_experts(device) -> dict:
    """``fused_experts`` over more than ``ONE_ROW_BLOCKS`` rows (so through the sort by expert)
    against the per-expert loop of ``FusedExperts`` on the CPU in float32: relative error within
    1e-5, for E = 64 top 4 and E = 512 top 10 with small expert widths."""
    from mtpserve.kernels.fused_moe_triton import ONE_ROW_BLOCKS, fused_experts

    worst = {}
    for T, k, E in ((20, 4, 64), (9, 10, 512)):
        assert T * k > ONE_ROW_BLOCKS
        g = torch.Generator().manual_seed(E)
        fe = _random_experts(E, 32, 16, g)
        x = torch.randn(T, 32, generator=g)
        ids = routed_ids(T, k, E, T)
        w = torch.rand(T, k, generator=g)
        with torch.inference_mode():
            want = fe(x, ids, w)
            got = fused_experts(x.to(device), ids.to(device), w.to(device),
                                fe.gate_up_proj.to(device), fe.down_proj.to(device)).cpu()
        err = ((got - want).norm() / want.norm()).item()
        worst[f"E={E} k={k} T={T}"] = err
        assert err < 1e-5, (E, k, T, err)
    return worst


def check_sliced_ids(device) -> dict:
    """``fused_experts`` given each column of wider ids alone (a [T, 1] slice, which flattens to
    a strided view: the kernels read it as contiguous before ids were made contiguous, and rows
    got the wrong experts) against the per-expert loop of ``FusedExperts`` on the CPU in
    float32: relative error within 1e-5 per column, at 3 tokens of top 5 over 12 experts."""
    from mtpserve.kernels import fused_moe_triton as fm

    g = torch.Generator().manual_seed(3)
    fe = _random_experts(12, 64, 32, g)
    wgu, wd = fe.gate_up_proj.to(device), fe.down_proj.to(device)
    x, ids, w = torch.randn(3, 64, generator=g), routed_ids(3, 5, 12, 3), torch.rand(3, 5)
    worst = {}
    with torch.inference_mode():
        for c in range(5):
            want = fe(x, ids[:, c:c + 1], w[:, c:c + 1])
            got = fm.fused_experts(x.to(device), ids.to(device)[:, c:c + 1],
                                   w.to(device)[:, c:c + 1], wgu, wd).cpu()
            worst[f"column {c}"] = ((got - want).norm() / want.norm()).item()
            assert worst[f"column {c}"] < 1e-5, (c, worst)
    return worst


def compile_for_hopper(num_experts: int, block_m: int, num_rows: int) -> dict:
    """Compile the align kernel for sm_90 (H100 / H200) as ``align_by_expert_triton`` would launch
    it for ``num_rows`` rows, PDL on, without a GPU (Triton's frontend, LLVM and ptxas only): the
    interpreter accepts some code the compiler refuses. Returns the compiled kernel's metadata
    (shared memory bytes, warps)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mtpserve.kernels import fused_moe_triton as fm

    e_pad = max(triton.next_power_of_2(num_experts), 2)
    chunk, count = fm.align_tiles(num_rows)
    sig = {"ids_ptr": "*i64", "rows_ptr": "*i64", "be_ptr": "*i64", "n": "i32"}
    consts = dict(E=num_experts, E_PAD=e_pad, LOG_E=e_pad.bit_length() - 1, BM=block_m,
                  CHUNK=chunk, COUNT_CHUNK=count, BLOCKS=max(1, fm.ALIGN_FILL // block_m),
                  PDL=True)
    sig.update({k: "constexpr" for k in consts})
    # an integer-only kernel: fp fusion named only so that Triton 3.9 does not warn
    kernel = triton.compile(ASTSource(fm._align_kernel, sig, consts),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": fm.ALIGN_WARPS, "enable_fp_fusion": False})
    return {"shared": kernel.metadata.shared, "num_warps": kernel.metadata.num_warps}
