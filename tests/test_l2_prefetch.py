"""kernels/l2_prefetch.py's host side: how the bytes are budgeted and shared out.

The prefetch itself is PTX (``prefetch.global.L2``) that only a CUDA device runs; its kernels'
outputs with and without it are compared in tests/test_gpu.py. Here: the shares the prefetching
programs take cover the planned bytes exactly, in whole lines, and nothing is planned off CUDA.
"""

import torch

from mtpserve.kernels import l2_prefetch


def _shares(a_bytes: int, b_bytes: int, programs: int) -> list[tuple[int, int, int, int]]:
    """Per program, ``prefetch_share``'s two byte ranges [lo, hi) of a and of b (its formula)."""
    chunk = l2_prefetch.chunk_bytes(a_bytes + b_bytes, programs)
    out = []
    for i in range(programs):
        lo, hi = i * chunk, (i + 1) * chunk
        out.append((min(lo, a_bytes), min(hi, a_bytes),
                    min(max(lo - a_bytes, 0), b_bytes), min(max(hi - a_bytes, 0), b_bytes)))
    return out


def test_budget_takes_weights_whole_in_order_then_a_prefix_of_whole_lines():
    mib = 1 << 20
    # 1.7B: o 8 MiB whole, then 16 MiB of the 48 MiB gate/up weight
    assert l2_prefetch.budget([8 * mib, 48 * mib], 24 * mib) == [8 * mib, 16 * mib]
    # 8B: the o weight alone is over the budget
    assert l2_prefetch.budget([32 * mib, 192 * mib], 24 * mib) == [24 * mib, 0]
    assert l2_prefetch.budget([1000, 5000], 10 ** 6) == [896, 4992]
    assert l2_prefetch.budget([4096], 0) == [0]


def test_shares_cover_every_planned_byte_once_in_whole_lines():
    for a_bytes, b_bytes, programs in [(8 << 20, 16 << 20, 64), (3 * 128, 0, 64),
                                       (128 * 1000, 128 * 7, 13), (0, 128 * 5, 2)]:
        covered_a, covered_b = [], []
        for lo_a, hi_a, lo_b, hi_b in _shares(a_bytes, b_bytes, programs):
            assert lo_a % 128 == 0 and lo_b % 128 == 0
            covered_a += range(lo_a, hi_a, 128)
            covered_b += range(lo_b, hi_b, 128)
        assert covered_a == list(range(0, a_bytes, 128))
        assert covered_b == list(range(0, b_bytes, 128))


def test_chunk_is_an_even_share_rounded_up_to_lines():
    assert l2_prefetch.chunk_bytes(24 << 20, 64) == 384 << 10
    assert l2_prefetch.chunk_bytes(129, 1) == 256
    assert l2_prefetch.chunk_bytes(128 * 10, 3) == 128 * 4


def test_nothing_is_planned_off_cuda_or_for_many_rows(monkeypatch):
    w = torch.zeros(64, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(l2_prefetch, "SITE", "attention")
    assert l2_prefetch.plan([w, w], rows=1) is None            # CPU: no PTX, no PDL
    monkeypatch.setattr(l2_prefetch, "SITE", None)
    assert l2_prefetch.plan([w, w], rows=1) is None


def test_kernel_args_compile_the_prefetch_out_without_a_plan_for_the_site():
    x = torch.zeros(2, 2)
    w = torch.zeros(256, dtype=torch.bfloat16)
    assert l2_prefetch.kernel_args(None, "attention", x, 64)["PF_LINES"] == 0
    p = l2_prefetch.Plan("qk_norm", w, 512, w, 0)
    assert l2_prefetch.kernel_args(p, "attention", x, 64)["PF_LINES"] == 0
    args = l2_prefetch.kernel_args(p, "qk_norm", x, 2)
    assert (args["PF_LINES"], args["pf_a_bytes"], args["pf_chunk"]) == (l2_prefetch.LINES, 512, 256)


def _compile_sm90(kernel, pointers: dict, consts: dict) -> str:
    """PTX of ``kernel`` compiled for sm_90 (H100 / H200) without a GPU (Triton's front end,
    LLVM and ptxas), integer arguments i32 unless ``pointers`` names a type."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {name: "constexpr" if name in consts else pointers.get(name, "i32")
           for name in inspect.signature(kernel.fn).parameters}
    compiled = triton.compile(ASTSource(kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4})
    return compiled.asm["ptx"]


def test_both_sites_compile_for_sm90_with_the_prefetch():
    """The CPU interpreter never runs the PTX: compile the two host kernels as the H200 runs
    them (Qwen3-1.7B's heads) and find the prefetch in the machine code's source."""
    from mtpserve.kernels import fused_triton, paged_attention_triton

    ptx = _compile_sm90(
        fused_triton._qk_norm_rope_kv_kernel,
        {**{n: "*bf16" for n in ["qkv_ptr", "q_ptr", "kc_ptr", "vc_ptr", "qw_ptr", "kw_ptr",
                                 "pf_a", "pf_b"]},
         "pos_ptr": "*i64", "slot_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
         "eps": "fp32"},
        dict(HQ=16, HKV=8, D=128, HALF=64, BLOCK_D=128, HAS_NORM=True, ZERO_CENTERED=False,
             PF_LINES=l2_prefetch.LINES, PDL=True))
    assert ptx.count("prefetch.global.L2") == 2   # the loops over a and over b
    ptx = _compile_sm90(
        paged_attention_triton._partial_kernel,
        {**{n: "*bf16" for n in ["q_ptr", "k_ptr", "v_ptr", "o_ptr", "pf_a", "pf_b"]},
         "tables_ptr": "*i32", "row_ptr": "*i64", "len_ptr": "*i64", "m_ptr": "*fp32",
         "l_ptr": "*fp32", "acc_ptr": "*fp32", "scale": "fp32"},
        dict(G=2, G_PAD=16, D=128, D_PAD=128, P_PAD=16, BLOCK=16, PART=512, TILE=64,
             SELF_MERGE=False, PRECISION=None, PF_LINES=l2_prefetch.LINES, PDL=True))
    assert ptx.count("prefetch.global.L2") == 2
