"""Checks of the FP8 draft head's product (kernels/fp8_head_triton.py), shared by the CPU tests
(under Triton's interpreter, tests/test_fp8_draft_head.py) and the GPU tests (tests/test_gpu.py):
the kernel against its PyTorch reference for one row and for several, float32 and bf16 x."""

from __future__ import annotations

import torch


def check_kernel(device: str, tiles=((32, 64, 4, 2), (64, 128, 4, 3)), N: int = 300,
                 Ks=(256, 80)) -> dict:
    """``fp8_logits`` against ``fp8_logits_torch`` on ``device`` for 1, 3 and 16 rows of x in
    float32 (CPU) or bf16, with each of ``tiles``, for each reduction length of ``Ks`` (80: not
    a power of two, inputs past it masked; the weight a view of rows whose columns past K hold
    NaN): {case: largest error / largest logit}."""
    from mtpserve.kernels.fp8_head_triton import fp8_logits, fp8_logits_torch, quantize_rows

    g = torch.Generator().manual_seed(0)
    worst = {}
    dtypes = (torch.float32, torch.bfloat16) if device == "cpu" else (torch.bfloat16,)
    for K in Ks:
        w8, scale = quantize_rows((torch.randn(N, K, generator=g) * 0.02).to(device))
        # rows of a wider buffer whose columns past K hold NaN: on CUDA an unmasked load past K
        # gives NaN logits (Triton's interpreter widens an FP8 NaN to 480, so there x's masked
        # zeros hide it; it does not check bounds either)
        wide = torch.full((N, K + 16), float("nan"), device=device).to(w8.dtype)
        wide[:, :K] = w8
        w8 = wide[:, :K]
        for dtype in dtypes:
            for rows in (1, 3, 16):
                x = torch.randn(rows, K, generator=g).to(device, dtype)
                want = fp8_logits_torch(x, w8, scale)
                for t in tiles:
                    got = fp8_logits(x, w8, scale, tiles=t)
                    assert got.shape == (rows, N) and got.dtype == torch.float32
                    err = ((got - want).abs().max() / want.abs().max()).item()
                    worst[f"K={K} {dtype} rows={rows} tiles={t}"] = err
                    assert err < 1e-5, (K, dtype, rows, t, err)
    return worst


def compile_for_hopper(rows: int, tiles) -> dict:
    """Compile the FP8 product's kernel for sm_90 (H100 / H200) as ``fp8_logits`` launches it
    with bf16 x, PDL on, without a GPU: {"shared": bytes, "num_warps": warps}."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mtpserve.kernels import fp8_head_triton as fh

    block_n, block_k, warps, stages = tiles
    sig = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "y_ptr": "*fp32",
           "M": "i32", "N": "i32", "sx": "i32", "sw": "i32", "sy": "i32"}
    consts = dict(K=2048, ROWS=1 if rows == 1 else 16, BLOCK_N=block_n, BLOCK_K=block_k,
                  STAGES=stages, WIDE=False, PDL=True)
    sig.update({k: "constexpr" for k in consts})
    kernel = triton.compile(ASTSource(fh._fp8_logits_kernel, sig, consts),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": warps, "launch_pdl": True,
                                     "enable_fp_fusion": True})
    return {"shared": kernel.metadata.shared, "num_warps": kernel.metadata.num_warps}


def check_head() -> dict:
    """``Fp8GreedyHead`` through the kernel and ``row_argmax`` (CPU, under the interpreter): its
    greedy ids for 1 and 5 rows over a full 200-token head and over a 12-token FR-Spec subset
    (ids mapped back through the subset), against the argmax of the PyTorch reference's logits.
    Returns {case: ids}."""
    from harness_draft_head import SUBSET, H, lm_head, target_of
    from mtpserve.kernels.fp8_head_triton import fp8_logits_torch
    from mtpserve.spec.draft_head import FullVocabHead, ReducedVocabHead, Fp8GreedyHead

    lm = lm_head()
    out = {}
    for name, base in (("full", FullVocabHead(target_of(lm))),
                       ("fr-spec", ReducedVocabHead(lm, torch.tensor(SUBSET)))):
        head = Fp8GreedyHead(base)
        for rows in (1, 5):
            hidden = torch.randn(rows, H, generator=torch.Generator().manual_seed(rows))
            got = head.greedy(hidden).tolist()
            best = fp8_logits_torch(hidden, head.w8, head.scale).argmax(-1)
            want = (best if name == "full" else torch.tensor(sorted(SUBSET))[best]).tolist()
            assert got == want, (name, rows, got, want)
            out[f"{name} rows={rows}"] = got
    return out
