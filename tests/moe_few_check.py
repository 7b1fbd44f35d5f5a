"""Checks of the few-token expert kernels (kernels/fused_moe_few.py), run under Triton's CPU
interpreter by tests/test_moe_few.py and on CUDA by tests/test_gpu.py."""

from __future__ import annotations

import torch

from moe_align_check import routed_ids

try:
    import triton
    import triton.language as tl

    from mtpserve.kernels.fused_moe_few import _tokens_of_expert
except ImportError:   # no Triton: only shared_rows is usable
    triton = None

# (tokens, top_k, experts): shared experts (2 tokens of top 8 over 8 experts: every expert
# twice), a verify step's 4 of top 8 over 64, 16 tokens (the most), k not a power of two
CASES = ((2, 8, 8), (4, 8, 64), (16, 2, 4), (3, 3, 5))


def shared_rows(ids: torch.Tensor) -> int:
    """(token, choice) rows of ``ids`` [T, k] routed to an expert an earlier row also has."""
    return ids.numel() - ids.unique().numel()


def check_few_tokens(device, dtype=torch.float32) -> dict:
    """For each of ``CASES``: ``fused_experts`` through the few-token kernels against the same
    call with them off (one block per row: the same products, so equal bits are asked) and
    against the per-expert loop of ``FusedExperts`` in float32 (relative error). Returns
    {case: [shared rows, bits equal, relative error]}."""
    from mtpserve.kernels import fused_moe_triton as fm
    from mtpserve.layers.moe import FusedExperts

    out = {}
    for T, k, E in CASES:
        g = torch.Generator().manual_seed(T * E)
        fe = FusedExperts(E, 64, 32)
        fe.gate_up_proj.data.normal_(0, 0.2, generator=g)
        fe.down_proj.data.normal_(0, 0.2, generator=g)
        x = torch.randn(T, 64, generator=g)
        ids = routed_ids(T, k, E, T + E)
        w = torch.rand(T, k, generator=g)
        args = (x.to(device, dtype), ids.to(device), w.to(device, dtype),
                fe.gate_up_proj.to(device, dtype), fe.down_proj.to(device, dtype))
        with torch.inference_mode():
            want = fe(x.to(dtype).float(), ids, w.to(dtype).float())
            got = fm.fused_experts(*args)
            fm.FEW_TOKENS = False
            try:
                rows = fm.fused_experts(*args)
            finally:
                fm.FEW_TOKENS = True
        err = ((got.float().cpu() - want).norm() / want.norm()).item()
        out[f"T={T} k={k} E={E}"] = [shared_rows(ids), bool(torch.equal(got, rows)), err]
    return out


def check_tokens_of_expert(device) -> dict:
    """What ``_tokens_of_expert`` gives each program (row r) for a [3, 2] routing where rows
    0 and 3 share expert 5 and rows 1 and 4 share expert 7: {r: [e, first, rows, valid]} with
    rows and valid over the first 3 tokens (the kernel's tile is 16)."""
    from mtpserve.kernels.fused_moe_few import MAX_TOKENS

    ids = torch.tensor([[5, 7], [7, 5], [2, 9]], device=device)
    out = torch.full((6, 2 + 2 * MAX_TOKENS), -9, dtype=torch.int64, device=device)
    _probe[(6,)](ids, out, 3, 2, KP=2, BM=MAX_TOKENS)
    o = out.cpu().tolist()
    return {r: [o[r][0], o[r][1], o[r][2:5], o[r][2 + MAX_TOKENS:5 + MAX_TOKENS]]
            for r in range(6)}


if triton is not None:
    @triton.jit
    def _probe(ids_ptr, out_ptr, T, top_k, KP: tl.constexpr, BM: tl.constexpr):
        """Stores _tokens_of_expert's (e, first, rows [BM], valid [BM]) at row program_id(0)."""
        e, first, rows, valid = _tokens_of_expert(ids_ptr, T, top_k, KP, BM)
        base = out_ptr + tl.program_id(0) * (2 + 2 * BM)
        tl.store(base, e)
        tl.store(base + 1, first.to(tl.int64))
        t = tl.arange(0, BM)
        tl.store(base + 2 + t, rows.to(tl.int64))
        tl.store(base + 2 + BM + t, valid.to(tl.int64))


def compile_for_hopper(down: bool) -> dict:
    """Compile the few-token gate/up (or down) kernel for sm_90, PDL on, bf16, at the hybrid
    shape's H 2048 / I 512 and a verify step's tiles (``moe_tiles(32)``), without a GPU.
    Returns the compiled kernel's metadata (shared memory bytes, warps)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mtpserve.kernels import fused_moe_few as few
    from mtpserve.kernels.fused_moe_triton import moe_tiles

    t = moe_tiles(32)
    ptrs = ["act_ptr", "w_ptr", "ids_ptr", "rw_ptr", "out_ptr"] if down else \
        ["x_ptr", "w_ptr", "ids_ptr", "act_ptr"]
    types = {"ids_ptr": "*i64"}
    sig = {p: types.get(p, "*bf16") for p in ptrs}
    sig.update({"T": "i32", "top_k": "i32"})
    names = ["sa", "swe", "swn", "so"] if down else ["sx", "swe", "swn", "sa"]
    sig.update({n: "i32" for n in names})
    bn, bk = (t.down_n, t.down_k) if down else (t.gate_up_n, t.gate_up_k)
    consts = dict(H=2048, I=512, KP=8, BM=few.MAX_TOKENS, BN=bn, BK=bk, PRECISION=None,
                  PDL=True)
    order = ptrs + ["T", "top_k", "H", "I"] + names + list(consts)[2:]
    full = {**sig, **{k: "constexpr" for k in consts}}
    kernel = few._down_few_kernel if down else few._gate_up_few_kernel
    compiled = triton.compile(ASTSource(kernel, {k: full[k] for k in order}, consts),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": t.num_warps, "enable_fp_fusion": True})
    return {"shared": compiled.metadata.shared, "num_warps": compiled.metadata.num_warps}
