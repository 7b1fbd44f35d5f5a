"""Sparse-MoE routing in one Triton kernel: softmax, top-k, renormalisation (and the shared
expert's sigmoid gate).

The routing of Qwen2-MoE / Qwen3-Next / Qwen3.5-MoE (HF transformers,
``models/qwen3_next/modeling_qwen3_next.py``: ``Qwen3NextTopKRouter`` and
``Qwen3NextSparseMoeBlock``; the sparse MoE of Shazeer et al. 2017): a token's router logits
over the E experts go through a float32 softmax, the k most probable experts are kept, their
probabilities are renormalised to sum 1 when the config asks (``norm_topk_prob``), and the
shared expert's output is scaled by ``sigmoid(shared_expert_gate(x))``. In PyTorch that is a
handful of tiny kernels per layer (softmax, a top-k of two kernels, sum, div, a cast, sigmoid);
at batch-1 decode they cost more device time than the arithmetic. Here one program holds a
token's E logits in registers (E padded to a power of two; on CUDA one token per program,
several under the CPU's interpreter) and:

1. takes the row maximum and ``sum(exp(l - max))`` (the softmax denominator);
2. k times: the largest logit not yet taken and its index (ties: the lowest expert index);
   softmax is monotonic, so this picks the experts of the k largest probabilities;
3. writes ``ids`` and the weights ``exp(l_id - max) / denominator`` (divided by their sum when
   renormalising), rounded once to the output dtype;
4. with ``shared_gate``, column E of the logits is the shared expert gate's logit: writes
   ``sigmoid`` of it, so the gate's [1, H] product can ride along in the router's product
   (with ``append_shared``, as a (k+1)-th choice of expert E: the shared expert run by the
   routed experts' kernels, layers/moe.py).

Selecting on the logits makes the ids independent of the exp implementation (the GPU's
``ex2.approx`` and PyTorch's ``expf`` may round a probability differently), and the tie rule
is fixed where ``torch.topk`` leaves the order of equal values unspecified. A NaN logit gives
meaningless weights but ids still inside [0, E). No host sync, no data-dependent shape: the
kernel can be captured in a CUDA graph.

Measured on the H200 (CUDA graphs, bf16, one token; router + shared-gate products, routing and
``routed + shared * gate``): E=512 k=10 H=2048 35 us -> 12 us (the routing kernel 4.3 us), E=64
k=8 28 us -> 9 us (2.1 us); 8192 tokens of E=512: the kernel 31 us, PyTorch's ops 220 us.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import compile_ahead, pdl
from mtpserve.kernels.pdl import pdl_wait

# most experts one program holds in registers (Qwen3-Next has 512)
MAX_EXPERTS = 1024


@triton.jit
def _route_kernel(logits_ptr, ids_ptr, w_ptr, gate_ptr, T, stride, E: tl.constexpr,
                  K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                  ROWS: tl.constexpr, RENORMALIZE: tl.constexpr, SHARED_GATE: tl.constexpr,
                  APPEND: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = rows < T
    rows_in = tl.minimum(rows, T - 1)            # rows past T recompute the last one, unstored
    offs = tl.arange(0, BLOCK_E)
    valid = offs < E
    l = tl.load(logits_ptr + rows_in[:, None] * stride + offs[None, :],
                mask=valid[None, :], other=float("-inf")).to(tl.float32)        # [ROWS, BLOCK_E]
    top = tl.max(l, 1)
    denom = tl.sum(tl.exp(l - top[:, None]), 1)  # padding: exp(-inf) = 0
    slot = tl.arange(0, BLOCK_K)
    sel_id = tl.zeros([ROWS, BLOCK_K], tl.int32)
    sel_l = tl.full([ROWS, BLOCK_K], float("-inf"), tl.float32)
    free = valid[None, :] & (rows_in[:, None] >= 0)
    for j in tl.static_range(K):
        cand = tl.where(free, l, float("-inf"))
        best = tl.max(cand, 1)
        idx = tl.min(tl.where(free & (cand == best[:, None]), offs[None, :], BLOCK_E), 1)
        idx = tl.minimum(idx, E - 1)             # a NaN row: still ids inside [0, E)
        free = free & (offs[None, :] != idx[:, None])
        sel_id = tl.where(slot[None, :] == j, idx[:, None], sel_id)
        sel_l = tl.where(slot[None, :] == j, best[:, None], sel_l)
    w = tl.exp(sel_l - top[:, None]) / denom[:, None]     # slots past K: 0
    if RENORMALIZE:
        w = w / tl.sum(w, 1)[:, None]
    W = K + APPEND                               # a row's choices (APPEND: the shared one)
    keep = live[:, None] & (slot < K)[None, :]
    out = rows[:, None] * W + slot[None, :]
    tl.store(ids_ptr + out, sel_id.to(tl.int64), mask=keep)
    tl.store(w_ptr + out, w.to(w_ptr.dtype.element_ty), mask=keep)
    if SHARED_GATE:
        g = tl.load(logits_ptr + rows_in * stride + E).to(tl.float32)
        gate = 1.0 / (1.0 + tl.exp(-g))
        if APPEND:   # choice K: expert E (the shared one), weighted by its gate
            tl.store(ids_ptr + rows * W + K, tl.full([ROWS], E, tl.int64), mask=live)
            tl.store(w_ptr + rows * W + K, gate.to(w_ptr.dtype.element_ty), mask=live)
        else:
            tl.store(gate_ptr + rows, gate.to(gate_ptr.dtype.element_ty), mask=live)


def _num_warps(block: int) -> int:
    # H200, 1 and 8192 tokens: one warp is fastest up to 512 experts (E=512, k=10: 4.3 us a
    # decode step, 31 us for 8192 tokens; 2 and 4 warps no faster at one token, slower at 8192)
    return 1 if block <= 512 else 4


def _rows_per_program(T: int, device: torch.device) -> int:
    # CUDA: one token per program (decode and verify steps have a few tokens, all in parallel).
    # The CPU runs only under Triton's interpreter, which runs programs one after another at a
    # fixed cost per op: there, one program takes up to 64 tokens.
    if device.type == "cuda":
        return 1
    return min(triton.next_power_of_2(max(T, 1)), 64)


def route(logits: torch.Tensor, top_k: int, renormalize: bool = True,
          shared_gate: bool = False, out_dtype: torch.dtype | None = None,
          rows_per_program: int | None = None, append_shared: bool = False):
    """Top-k softmax routing of each token (see the module docstring for the algorithm).

    Args:
        logits: [T, E] router logits, or [T, E + 1] with ``shared_gate`` (column E: the shared
            expert gate's logit); any float dtype, computed in float32; rows may be strided, the
            columns must be contiguous (otherwise a contiguous copy is made). On a CUDA device
            (or the CPU under ``TRITON_INTERPRET=1``).
        top_k: experts per token, 1 <= top_k <= E.
        renormalize: divide the k weights by their sum (Qwen's ``norm_topk_prob``).
        shared_gate: whether the last column is the shared expert gate's logit.
        out_dtype: dtype of the weights and the gate (default: the logits' dtype).
        rows_per_program: tokens per Triton program, a power of two (default: 1 on CUDA, up to
            64 on the CPU); the results do not depend on it.
        append_shared: with ``shared_gate``: each token gets a (k+1)-th choice, expert E (the
            shared expert, stored after the routed ones: layers/moe.py) weighted by the gate.

    Returns:
        ``(ids, weights, gate)``: ``ids`` [T, k] int64, expert indices by decreasing logit
        (equal logits: lowest index first); ``weights`` [T, k] in ``out_dtype``, their softmax
        probabilities (renormalised when asked); ``gate`` [T, 1] in ``out_dtype``,
        ``sigmoid(logits[:, E])``, or None without ``shared_gate``. With ``append_shared``
        ``ids`` and ``weights`` are [T, k + 1], column k holding E and the gate, and ``gate``
        is that column of ``weights`` (a view).

    Raises:
        ValueError: logits not 2-D or not floating point, ``top_k`` outside [1, E], E above
            ``MAX_EXPERTS``, or ``rows_per_program`` not a power of two.
    """
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"route takes [T, E] float logits, got {tuple(logits.shape)} "
                         f"{logits.dtype}")
    T, cols = logits.shape
    E = cols - int(shared_gate)
    if E > MAX_EXPERTS:
        raise ValueError(f"route takes at most {MAX_EXPERTS} experts, got {E}")
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be in [1, {E}], got {top_k}")
    if append_shared and not shared_gate:
        raise ValueError("append_shared needs shared_gate (the gate weighs the shared choice)")
    rows = rows_per_program or _rows_per_program(T, logits.device)
    if rows < 1 or rows & (rows - 1):
        raise ValueError(f"rows_per_program must be a power of two, got {rows}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out_dtype = out_dtype or logits.dtype
    dev = logits.device
    # a dry forward (kernels/compile_ahead.py) does not run the kernel: ids stay valid indices
    width = top_k + int(append_shared)
    ids = (torch.zeros if compile_ahead.dry() else torch.empty)(T, width, dtype=torch.int64,
                                                                device=dev)
    weights = torch.empty(T, width, dtype=out_dtype, device=dev)
    if append_shared:
        gate = weights[:, top_k:]
    else:
        gate = torch.empty(T, 1, dtype=out_dtype, device=dev) if shared_gate else None
    if T:
        block_e = triton.next_power_of_2(E)
        _route_kernel[(triton.cdiv(T, rows),)](
            logits, ids, weights, gate if shared_gate else weights, T, logits.stride(0), E=E,
            K=top_k, BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(top_k), ROWS=rows,
            RENORMALIZE=bool(renormalize), SHARED_GATE=bool(shared_gate),
            APPEND=int(append_shared), num_warps=_num_warps(block_e * rows), **pdl.launch(logits))
    return ids, weights, gate
