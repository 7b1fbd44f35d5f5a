"""Send the next products' weights to L2 while a dense layer's attention runs.

At batch 1 a dense layer streams its four weights from HBM (kernels/gemv_triton.py) and between
the q/k/v product and the o product runs a chain of short kernels that read almost nothing: q/k
norm + RoPE + KV write, the attention partitions and their merge, ~6-8 us a layer on the H200
(BENCHMARKS.md, session 18), while HBM idles. Here extra programs of one of those kernels issue
per-line L2 prefetches (PTX ``prefetch.global.L2``: fire and forget, no registers held past the
instruction) of the o weight and then the first bytes of the next product's weight (the gate/up
weight, whose first wave of row tiles reads the start of the matrix), so the o product and the
first gate/up tiles read them from L2. The prefetching programs split the bytes evenly.

Earlier prefetches that lost (BENCHMARKS.md): each product program's own first 32 KiB before its
PDL wait (session 5: +-0.03 ms), bulk prefetches from the single program of each short kernel
before its wait (session 18: one SM issued them at ~0.4 TB/s on the step's critical path), the
down weights during the gate/up phase of a persistent MLP (session 21: they compete for HBM with
the loads in flight). These programs run where HBM is otherwise idle (after the q/k/v product has
finished) and are spread over many SMs.

Sites (``SITE``): ``"qk_norm"``, extra programs of the q/k norm + RoPE + KV write kernel, which
prefetch after its PDL wait (the q/k/v product has finished); ``"attention"``, extra programs of
the attention partial kernel, which launch once the q/k/v product has finished and do not wait
for the kernel before them. A hint only: results never depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# where the prefetching programs run: "qk_norm", "attention", or None (off)
SITE = None
# bytes sent to L2 per layer at most: all of the o weight first, then the next product's first
# bytes (an H100 / H200 has 50 MB of L2)
MAX_BYTES = 24 << 20
# prefetching programs a site adds
PROGRAMS = 64
# 128-byte lines one prefetching program asks for per loop iteration (one per thread at 4 warps)
LINES = 128
LINE_BYTES = 128


@dataclass(frozen=True)
class Plan:
    """Up to ``MAX_BYTES`` of two weights to prefetch, in order: ``a`` (``a_bytes`` of it from
    its start), then ``b`` (``b_bytes``). Byte counts are multiples of ``LINE_BYTES``."""
    site: str
    a: torch.Tensor
    a_bytes: int
    b: torch.Tensor
    b_bytes: int

    @property
    def total(self) -> int:
        return self.a_bytes + self.b_bytes


def plan(weights: list[torch.Tensor | None], rows: int) -> Plan | None:
    """The prefetch of ``weights`` (in the order the products read them) for a step of ``rows``
    tokens, or None: ``SITE`` off, more rows than a skinny product takes (its products are not
    bound by one read of the weights), PDL off (``pdl.enabled``: CUDA of compute capability
    9.0+, which the PTX needs too), or nothing to send. Each weight must be contiguous (its bytes are read from its start)."""
    from mtpserve.kernels import gemv_triton, pdl

    weights = [w for w in weights if w is not None][:2]
    if (SITE is None or not weights or rows > gemv_triton.MAX_ROWS
            or not pdl.enabled(weights[0])):
        return None
    if any(not w.is_contiguous() for w in weights):
        raise ValueError("l2_prefetch: a weight must be contiguous")
    sizes = budget([w.numel() * w.element_size() for w in weights], MAX_BYTES)
    if len(weights) == 1:
        weights, sizes = weights * 2, [sizes[0], 0]
    if sizes[0] + sizes[1] == 0:
        return None
    return Plan(SITE, weights[0], sizes[0], weights[1], sizes[1])


def budget(sizes: list[int], max_bytes: int) -> list[int]:
    """Bytes to prefetch of each weight of ``sizes`` bytes, in order, ``max_bytes`` in all:
    each whole until the budget runs out, then a prefix; whole lines only."""
    out, left = [], max_bytes
    for size in sizes:
        n = max(0, min(left, size)) // LINE_BYTES * LINE_BYTES
        out.append(n)
        left -= n
    return out


def chunk_bytes(total: int, programs: int) -> int:
    """Bytes each of ``programs`` prefetching programs takes of ``total``: an even share,
    rounded up to whole lines (the last programs may get less, or nothing)."""
    share = -(-total // max(programs, 1))
    return -(-share // LINE_BYTES) * LINE_BYTES


def kernel_args(p: Plan | None, site: str, x: torch.Tensor, programs: int) -> dict:
    """Arguments ``pf_a, pf_a_bytes, pf_b, pf_b_bytes, pf_chunk, PF_LINES`` of a kernel that
    calls :func:`prefetch_share` from ``programs`` programs, for plan ``p`` at ``site``
    (``PF_LINES`` 0, the prefetch compiled out, when ``p`` is None or is for another site; ``x``
    stands in for the unread pointers)."""
    if p is None or p.site != site:
        return dict(pf_a=x, pf_a_bytes=0, pf_b=x, pf_b_bytes=0, pf_chunk=0, PF_LINES=0)
    return dict(pf_a=p.a, pf_a_bytes=p.a_bytes, pf_b=p.b, pf_b_bytes=p.b_bytes,
                pf_chunk=chunk_bytes(p.total, programs), PF_LINES=LINES)


@triton.jit
def prefetch_share(a_ptr, a_bytes, b_ptr, b_bytes, chunk, index, LINES: tl.constexpr):
    """Prefetching program ``index``: sends bytes ``[index * chunk, (index + 1) * chunk)`` of
    the concatenation ``a[:a_bytes] ++ b[:b_bytes]`` to L2, one ``prefetch.global.L2`` per
    128-byte line (sm_90 PTX; never under the CPU interpreter, where plans are None)."""
    lo = index * chunk
    hi = lo + chunk
    _prefetch_range(a_ptr, tl.minimum(lo, a_bytes), tl.minimum(hi, a_bytes), LINES)
    _prefetch_range(b_ptr, tl.minimum(tl.maximum(lo - a_bytes, 0), b_bytes),
                    tl.minimum(tl.maximum(hi - a_bytes, 0), b_bytes), LINES)


@triton.jit
def _prefetch_range(ptr, lo, hi, LINES: tl.constexpr):
    """Prefetch bytes ``[lo, hi)`` of ``ptr`` to L2 (nothing when ``lo >= hi``)."""
    base = ptr.to(tl.pointer_type(tl.int8), bitcast=True)
    for off in range(lo, hi, LINES * 128):
        at = tl.minimum(off + tl.arange(0, LINES) * 128, hi - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                  [base + at], dtype=tl.int32, is_pure=False, pack=1)
