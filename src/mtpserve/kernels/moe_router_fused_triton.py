"""The MoE router's product and its routing in one Triton kernel, for decode and verify steps.

A sparse MoE layer on CUDA ran two kernels before its experts: the router's product
(``x [T, H] @ w[E + 1, H]^T`` in float32, the shared expert gate's row last; layers/moe.py
``_router_logits``) and the routing (kernels/moe_router_triton.py). At a few tokens each is a
few microseconds and each is a kernel boundary of the step's CUDA graph. Here they are one:

- program ``(t, p)`` multiplies token t by ``BLOCK_N`` rows of the router weight (loaded
  before the PDL wait: they do not depend on the kernel before) over the whole of H, float32
  multiply-and-sum, and stores those float32 logits in a [T, E + 1] buffer;
- the last of a token's programs to arrive (kernels/arrival.py: one counter per token) reads
  the token's logits back from L2 and routes them with the routing kernel's own code
  (``moe_router_triton.route_rows``: softmax, top-k, renormalisation, the shared gate).

A row's logits do not depend on T or on which program arrives last, so decode and verify
route a token the same way. They are summed in another order than the skinny product's
(kernels/gemv_triton.py), so they may differ from it in the last bits; both are float32
(router logits rounded to bfloat16 tie often among hundreds of experts). No host sync, no
data-dependent shape: the kernel can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import arrival, compile_ahead, pdl
from mtpserve.kernels.arrival import arrive_last
from mtpserve.kernels.gemv_stream_triton import to_f32
from mtpserve.kernels.moe_router_triton import MAX_EXPERTS, route_rows
from mtpserve.kernels.pdl import pdl_wait

# most tokens one call takes (decode and verify steps of a few sequences; each token's
# programs read the whole router weight, from L2 after the first: past this many, the skinny
# product or cuBLAS reads it once)
MAX_TOKENS = 16
# weight elements one program holds in registers: BLOCK_N rows of the padded H
TILE_ELEMENTS = 8192


@triton.jit
def _product_route_kernel(x_ptr, w_ptr, logits_ptr, count_ptr, ids_ptr, wt_ptr, gate_ptr, sx,
                          sw, H: tl.constexpr, E: tl.constexpr, K: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_E: tl.constexpr,
                          BLOCK_K: tl.constexpr, RENORMALIZE: tl.constexpr,
                          SHARED_GATE: tl.constexpr, APPEND: tl.constexpr,
                          LATE: tl.constexpr, PDL: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    N = E + SHARED_GATE
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    c = tl.arange(0, BLOCK_H)
    w = tl.load(w_ptr + n[:, None] * sw + c[None, :],
                mask=(n < N)[:, None] & (c < H)[None, :], other=0.0)   # before the wait
    pdl_wait(PDL)
    x = tl.load(x_ptr + t * sx + c, mask=c < H, other=0.0).to(tl.float32)
    row = logits_ptr + t * N
    tl.store(row + n, tl.sum(to_f32(w, LATE) * x[None, :], 1), mask=n < N)
    if arrive_last(count_ptr + t, tl.num_programs(1)):
        route_rows(row + tl.zeros([1], tl.int64), t + tl.zeros([1], tl.int64),
                   tl.full([1], True, tl.int1), ids_ptr, wt_ptr, gate_ptr, E, K, BLOCK_E,
                   BLOCK_K, 1, RENORMALIZE, SHARED_GATE, APPEND, True)


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`product_route` takes these: 1 to ``MAX_TOKENS`` tokens of a 16-bit or
    float32 ``x`` [T, H] and a ``weight`` [N, H] of the same dtype, contiguous along H, N at most
    ``MAX_EXPERTS + 1`` and H at most ``TILE_ELEMENTS``."""
    return (x.dim() == 2 and weight.dim() == 2 and 1 <= x.shape[0] <= MAX_TOKENS
            and x.shape[1] == weight.shape[1] <= TILE_ELEMENTS and weight.stride(1) == 1
            and weight.shape[0] <= MAX_EXPERTS + 1 and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32))


def product_route(x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool = True,
                  shared_gate: bool = False, append_shared: bool = False,
                  block_n: int | None = None, num_warps: int = 4):
    """Router logits and their routing in one kernel (module docstring): what
    ``moe_router_triton.route(x @ weight^T in float32, ...)`` returns, with
    ``out_dtype = x.dtype``.

    Args:
        x: [T, H] hidden states, 1 <= T <= ``MAX_TOKENS``, float32 / bfloat16 / float16, rows
            may be strided (columns contiguous). CUDA, or the CPU under ``TRITON_INTERPRET=1``.
        weight: [E, H], or [E + 1, H] with ``shared_gate`` (row E: the shared expert gate),
            x's dtype, contiguous along H; E <= ``MAX_EXPERTS``.
        top_k, renormalize, shared_gate, append_shared: as for ``route``.
        block_n: weight rows a program multiplies, a power of two (default: as many as fit
            ``TILE_ELEMENTS`` with H padded to a power of two).
        num_warps: warps a program.

    Returns:
        ``(ids, weights, gate, logits)``: the first three as ``route`` returns them (weights
        and gate in x's dtype); ``logits`` [T, N] float32, the product.

    Raises:
        ValueError: the shapes, dtypes or sizes outside :func:`fits`, ``top_k`` outside [1, E],
            ``append_shared`` without ``shared_gate``, or ``block_n`` not a power of two.
    """
    if not fits(x, weight):
        raise ValueError(f"product_route takes 1-{MAX_TOKENS} tokens x [T, H] and a weight "
                         f"[N <= {MAX_EXPERTS + 1}, H <= {TILE_ELEMENTS}] of its float dtype, "
                         f"contiguous along H; got x {tuple(x.shape)} {x.dtype}, weight "
                         f"{tuple(weight.shape)} {weight.dtype} stride {weight.stride()}")
    T, H = x.shape
    N = weight.shape[0]
    E = N - int(shared_gate)
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be in [1, {E}], got {top_k}")
    if append_shared and not shared_gate:
        raise ValueError("append_shared needs shared_gate (the gate weighs the shared choice)")
    block_h = triton.next_power_of_2(H)
    block_n = block_n or max(1, min(TILE_ELEMENTS // block_h, triton.next_power_of_2(N)))
    if block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two, got {block_n}")
    if x.stride(1) != 1:
        x = x.contiguous()
    dev = x.device
    width = top_k + int(append_shared)
    # a dry forward (kernels/compile_ahead.py) does not run the kernel: ids stay valid indices
    ids = (torch.zeros if compile_ahead.dry() else torch.empty)(T, width, dtype=torch.int64,
                                                                device=dev)
    weights = torch.empty(T, width, dtype=x.dtype, device=dev)
    logits = torch.empty(T, N, dtype=torch.float32, device=dev)
    if append_shared:
        gate = weights[:, top_k:]
    else:
        gate = torch.empty(T, 1, dtype=x.dtype, device=dev) if shared_gate else None
    _product_route_kernel[(T, triton.cdiv(N, block_n))](
        x, weight, logits, arrival.counters(dev), ids, weights,
        gate if shared_gate else weights, x.stride(0), weight.stride(0), H=H, E=E, K=top_k,
        BLOCK_N=block_n, BLOCK_H=block_h, BLOCK_E=triton.next_power_of_2(E),
        BLOCK_K=triton.next_power_of_2(top_k), RENORMALIZE=bool(renormalize),
        SHARED_GATE=int(shared_gate), APPEND=int(append_shared),
        LATE=x.is_cuda and x.dtype == torch.bfloat16, num_warps=num_warps, **pdl.launch(x))
    return ids, weights, gate, logits
