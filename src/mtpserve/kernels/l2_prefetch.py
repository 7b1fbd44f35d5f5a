"""Prefetch the next skinny product's weights into L2 from the short kernel before it.

At batch 1 a dense layer alternates HBM-bound products (q/k/v, o, gate/up, down:
kernels/gemv_triton.py) with short kernels that read almost nothing (the norms, q/k norm + RoPE +
KV write, SiLU-and-mul). While a short kernel runs, and while the product after it fills its
pipeline, HBM idles: on the H200 the 1.7B shape's products ran at 1.4-3.7 TB/s against ~4.8
(BENCHMARKS.md, session 17). Here the short kernel's first program issues asynchronous bulk L2
prefetches of the next product's weight (PTX ``cp.async.bulk.prefetch.L2.global``, sm_90+:
fire and forget, no registers or shared memory held) before its PDL wait (kernels/pdl.py), so
the weight streams in while the chain of short kernels runs and the product then reads it from
L2. Only the first ``MAX_BYTES`` of a weight are prefetched (L2 holds 50 MB on an H100/H200);
batches of more rows than the skinny product takes get no prefetch (their products are not
bound by one read of the weights). A hint only: results never depend on it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# bytes of a weight prefetched at most (0: off; benchmarks/gpu_decode.py --compare switches it)
MAX_BYTES = 16 << 20
# bulk prefetches issued per use, one per program element (a power of two)
CHUNKS = 256
# smallest weight worth a prefetch
MIN_BYTES = 1 << 20


def launch_args(weight: torch.Tensor | None, x: torch.Tensor) -> dict:
    """Keyword arguments ``pf_ptr``, ``pf_bytes`` and ``PF_CHUNKS`` for a kernel that takes
    :func:`prefetch_l2`'s operands: ``weight``'s first ``min(MAX_BYTES, nbytes)`` bytes (rounded
    down to 16) when ``x`` [rows, ...] is on a CUDA device of compute capability 9.0+ with at most
    the skinny product's rows; otherwise ``PF_CHUNKS=0`` (the prefetch compiles out)."""
    from mtpserve.kernels import gemv_triton, pdl

    rows = x.shape[0] if x.dim() > 1 else 1
    nbytes = 0 if weight is None else min(MAX_BYTES, weight.numel() * weight.element_size())
    if (nbytes < MIN_BYTES or rows > gemv_triton.MAX_ROWS or not weight.is_cuda
            or not pdl.supported(weight)):
        return dict(pf_ptr=x, pf_bytes=0, PF_CHUNKS=0)
    return dict(pf_ptr=weight, pf_bytes=nbytes // 16 * 16, PF_CHUNKS=CHUNKS)


@triton.jit
def prefetch_l2(pf_ptr, pf_bytes, PF_CHUNKS: tl.constexpr):
    """From the grid's first program only: ``PF_CHUNKS`` bulk L2 prefetches covering bytes
    ``[0, pf_bytes)`` of ``pf_ptr`` (16-byte aligned, ``pf_bytes`` a multiple of 16 and at least
    ``16 * PF_CHUNKS``). Nothing when ``PF_CHUNKS`` is 0."""
    if PF_CHUNKS > 0:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
            chunk = (pf_bytes // PF_CHUNKS + 15) // 16 * 16
            start = tl.minimum(tl.arange(0, PF_CHUNKS) * chunk, pf_bytes - 16)
            size = tl.maximum(tl.minimum(pf_bytes - start, chunk), 16)
            base = pf_ptr.to(tl.pointer_type(tl.int8), bitcast=True)
            tl.inline_asm_elementwise(
                "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                [base + start.to(tl.int64), size.to(tl.int32)], dtype=tl.int32, is_pure=False,
                pack=1)
