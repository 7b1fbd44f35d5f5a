"""Expert products of a few tokens (a verify step's 1 + k) reading each chosen expert once.

``fused_experts`` (fused_moe_triton.py) gives decode and verify steps one block per (token,
choice) row, without the sort by expert: a sort costs a kernel, and few rows share an expert.
But a verify step of 4 tokens, top 8 of 64 experts, routes its 32 rows to 64 (1 - (7/8)^4)
= 26.5 distinct experts on average (uniform routing; consecutive tokens of real text share
more), so one block per row reads ~17% of the expert bytes twice.

Here a program is launched per (row r, output tile) as there, but works only if r is the first
row routed to its expert e; it then gathers every token routed to e (a token picks an expert
at most once, so at most T <= ``MAX_TOKENS`` of them: one tile of ``BM`` = 16 rows, the tile
``tl.dot`` needs anyway) and multiplies them against e's weights in one pass. The other
programs return at once. No layout kernel runs: each program finds its tokens from the [T, k]
ids. Per row the products are those of the one-row blocks (same tiles, same reduction order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.pdl import pdl_wait

# most tokens (rows of x) one program gathers: tl.dot's smallest M
MAX_TOKENS = 16


@triton.jit
def _tokens_of_expert(ids_ptr, T, top_k, KP: tl.constexpr, BM: tl.constexpr):
    """For this program's row r = program_id(0): (e, first, rows [BM], valid [BM]) where e is
    r's expert, ``first`` whether no earlier row is routed to e, and for token t < BM
    ``rows[t]`` its (token * top_k + choice) row routed to e, valid where it has one."""
    r = tl.program_id(0)
    e = tl.load(ids_ptr + r)
    t = tl.arange(0, BM)
    c = tl.arange(0, KP)
    ok = (t[:, None] < T) & (c[None, :] < top_k)
    flat = t[:, None] * top_k + c[None, :]
    ids = tl.load(ids_ptr + flat, mask=ok, other=-1)
    hit = ids == e
    first = tl.min(tl.where(hit, flat, T * top_k), axis=1)
    first = tl.min(first, axis=0) == r
    rows = tl.sum(tl.where(hit, flat, 0), axis=1)
    valid = tl.sum(hit.to(tl.int32), axis=1) > 0
    return e, first, rows, valid


@triton.jit
def _gate_up_few_kernel(x_ptr, w_ptr, ids_ptr, act_ptr, T, top_k, H: tl.constexpr,
                        I: tl.constexpr, sx, swe, swn, sa, KP: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
                        PDL: tl.constexpr):
    pdl_wait(PDL)
    e, first, rows, valid = _tokens_of_expert(ids_ptr, T, top_k, KP, BM)
    if not first:
        return
    tok = tl.arange(0, BM)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_ok = offs_n < I
    w_base = w_ptr + e.to(tl.int64) * swe
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, H, BK):
        offs_k = k0 + tl.arange(0, BK)
        k_ok = offs_k < H
        xa = tl.load(x_ptr + tok[:, None] * sx + offs_k[None, :],
                     mask=valid[:, None] & k_ok[None, :], other=0.0)
        wmask = k_ok[:, None] & n_ok[None, :]
        wg = tl.load(w_base + offs_n[None, :] * swn + offs_k[:, None], mask=wmask, other=0.0)
        wu = tl.load(w_base + (I + offs_n)[None, :] * swn + offs_k[:, None], mask=wmask,
                     other=0.0)
        acc_g = tl.dot(xa, wg, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(xa, wu, acc_u, input_precision=PRECISION)
    y = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(act_ptr + rows[:, None] * sa + offs_n[None, :], y.to(act_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _down_few_kernel(act_ptr, w_ptr, ids_ptr, rw_ptr, out_ptr, T, top_k, H: tl.constexpr,
                     I: tl.constexpr, sa, swe, swn, so, KP: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
                     PDL: tl.constexpr):
    pdl_wait(PDL)
    e, first, rows, valid = _tokens_of_expert(ids_ptr, T, top_k, KP, BM)
    if not first:
        return
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_ok = offs_n < H
    w_base = w_ptr + e.to(tl.int64) * swe
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, I, BK):
        offs_k = k0 + tl.arange(0, BK)
        k_ok = offs_k < I
        a = tl.load(act_ptr + rows[:, None] * sa + offs_k[None, :],
                    mask=valid[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + offs_n[None, :] * swn + offs_k[:, None],
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    rw = tl.load(rw_ptr + rows, mask=valid, other=0.0).to(tl.float32)
    acc = acc * rw[:, None]
    tl.store(out_ptr + rows[:, None] * so + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


def few_token_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                      gate_up: torch.Tensor, down: torch.Tensor, tiles) -> torch.Tensor:
    """Routed expert outputs of T <= ``MAX_TOKENS`` tokens, summed over each token's choices,
    each chosen expert's weights read once per output tile (module doc).

    Args:
        x: [T, H] activations; ids: [T, k] int64 expert indices (a token's k distinct);
        weights: [T, k] routing weights; gate_up: [E, 2I, H]; down: [E, H, I]; all on one CUDA
        device (or CPU under ``TRITON_INTERPRET=1``), weights in x's dtype.
        tiles: a fused_moe_triton.MoETiles (output / reduction tiles, warps).

    Returns:
        [T, H] in x's dtype, as ``fused_experts``.

    Raises:
        ValueError: T > MAX_TOKENS.
    """
    T, k = ids.shape
    if T > MAX_TOKENS:
        raise ValueError(f"few_token_experts takes at most {MAX_TOKENS} tokens, got {T}")
    E, two_i, H = gate_up.shape
    inter, n = two_i // 2, T * k
    x, ids = x.contiguous(), ids.contiguous()
    kp = triton.next_power_of_2(k)
    prec = "ieee" if x.dtype == torch.float32 else None
    act = x.new_empty(n, inter)
    _gate_up_few_kernel[(n, triton.cdiv(inter, tiles.gate_up_n))](
        x, gate_up, ids, act, T, k, H, inter, x.stride(0), gate_up.stride(0),
        gate_up.stride(1), act.stride(0), KP=kp, BM=MAX_TOKENS, BN=tiles.gate_up_n,
        BK=tiles.gate_up_k, PRECISION=prec, num_warps=tiles.num_warps, **pdl.launch(x))
    out = x.new_empty(n, H)
    _down_few_kernel[(n, triton.cdiv(H, tiles.down_n))](
        act, down, ids, weights.contiguous().flatten(), out, T, k, H, inter, act.stride(0),
        down.stride(0), down.stride(1), out.stride(0), KP=kp, BM=MAX_TOKENS,
        BN=tiles.down_n, BK=tiles.down_k, PRECISION=prec, num_warps=tiles.num_warps,
        **pdl.launch(x))
    return out.view(T, k, H).sum(1)
