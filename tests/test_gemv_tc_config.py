"""The Gluon tensor-core stream's units and routing (kernels/gemv_tc_gluon.py,
gemv_triton.tc_fits) without a GPU: tc_config's rule for the benchmark weights, CPU tensors
never routed to it, and its kernel compiled for sm_90 by this Triton (no launch)."""

from __future__ import annotations

import pytest
import torch

gluon = pytest.importorskip("triton.experimental.gluon")


@pytest.mark.parametrize("n, k, expected", [
    (960, 576, (512, 2)), (576, 576, (512, 2)), (3072, 576, (512, 2)), (576, 1536, (512, 3)),
    (4096, 2048, (512, 3)), (2048, 2048, (512, 4)), (12288, 2048, (256, 3)),
    (2048, 6144, (512, 4)), (24576, 4096, (256, 3)), (768, 256, (128, 2)), (256, 64, (32, 2)), (8192, 256, (128, 3))])
def test_tc_config_for_the_benchmark_weights(n, k, expected):
    """On 132 SMs: units of 512 inputs, 4 in flight for one program a SM, 3 for two, never more
    than the reduction has, nor fewer than 2; units of 256, 3 in flight, past two programs a SM;
    a reduction of at most 512 in two units."""
    from mtpserve.kernels.gemv_tc_gluon import tc_config

    assert tc_config(n, k, 132) == dict(block_k=expected[0], stages=expected[1], num_warps=1)


def test_cpu_tensors_never_take_the_tc_stream():
    from mtpserve.kernels import gemv_triton

    x, w = torch.zeros(4, 512, dtype=torch.bfloat16), torch.zeros(256, 512, dtype=torch.bfloat16)
    assert not gemv_triton.tc_fits(x, w)
    with pytest.raises(ValueError, match="gemv_tc"):
        gemv_triton.gemv_tc(x, w)


@pytest.mark.parametrize("k, block_k, stages, xr, swiglu", [
    (576, 512, 2, 8, False), (2048, 256, 3, 16, True), (256, 128, 2, 8, True)])
def test_tc_kernel_compiles_for_sm90(k, block_k, stages, xr, swiglu):
    """The kernel through this Triton's compiler for sm_90 (PTX only: no GPU, no ptxas): the
    weight's first copies issued before ``griddepcontrol.wait``, products on ``mma.sync``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from mtpserve.kernels import gemv_tc_gluon

    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32", "N": "i32",
           "sx": "i32", "sw": "i32", "sy": "i32"}
    consts = dict(K=k, BLOCK_K=block_k, STAGES=stages, XR=xr, NACC=2, SWIGLU=swiglu, PDL=True,
                  num_warps=1)
    sig.update({name: "constexpr" for name in consts})
    names = list(sig)
    aligned = [(names.index(a),) for a in ("x_ptr", "w_ptr", "y_ptr", "sx", "sw", "sy")]
    src = GluonASTSource(gemv_tc_gluon._tc_kernel, sig, consts,
                         {i: [["tt.divisibility", 16]] for i in aligned})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=1)).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert 0 <= ptx.find("cp.async.cg.shared.global") < wait
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx[wait:]
