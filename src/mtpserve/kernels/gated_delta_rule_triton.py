"""Gated DeltaNet for small queries (decode, speculative verify) in two Triton kernels.

The plain-PyTorch path (``kernels/gated_delta_rule.py``, the reference these kernels are tested
against in tests/gdn_kernel_check.py) runs a Gated DeltaNet layer's padded block of sequences
[Bs, T] (1 <= T <= 16) as dozens of tiny kernels per layer: gathers and scatters of the state
slots, the short convolution, and per token a decay, two einsums and the delta update. Here:

- :func:`fused_causal_conv1d`: the depthwise causal convolution with SiLU, reading each
  sequence's conv state from its slot and writing back the state after its last real token
  (and, for verify, the state after every real token into its scratch row);
- :func:`fused_recurrent_gated_delta_rule`: the gated delta rule (Yang, Kautz & Hatamizadeh
  2024, "Gated Delta Networks", eq. 10; see the reference module's docstring for the maths),
  one program per (sequence, value head, block of BV value columns) holding its [Dk, BV] float32
  state tile in registers across the T tokens; the L2 norm of q and k, the q scale Dk ** -0.5,
  the key-head sharing of grouped value heads (value head h reads key head h // (Hv // Hk)) and
  optionally the gates ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)`` are
  computed inside. flash-linear-attention's ``fused_recurrent_gated_delta_rule`` is a known
  implementation of the same recurrence; this one is written for the engine's slot / scratch
  layout (engine/state_cache.py).

Tokens past ``last[b]`` in a sequence's row are padding: they get ``g = beta = 0`` (the SSM state
stays as after the last real token), their outputs are computed and meant to be dropped, and no
state of theirs is written to a slot or scratch row. Everything is shape-static and free of host
synchronisation, so both kernels can be captured in CUDA graphs (engine/hybrid_graph.py). All
arithmetic is float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.jit_options import unspecialized
from mtpserve.kernels.pdl import pdl_wait


@triton.jit
def _softplus(x):
    """torch's ``F.softplus`` (beta 1, threshold 20): x above 20, else log1p(exp(x)), with
    log1p through ``log(1 + e) * e / ((1 + e) - 1)`` (exact where 1 + e rounds)."""
    e = tl.exp(tl.minimum(x, 20.0))
    y = 1.0 + e
    d = tl.where(y == 1.0, 1.0, y - 1.0)
    lp = tl.where(y == 1.0, e, tl.log(y) * e / d)
    return tl.where(x > 20.0, x, lp)


@triton.jit
def _l2norm(x, eps):
    return x * tl.rsqrt(tl.sum(x * x, axis=0) + eps)


@triton.jit
def _masked(mask, keep):
    """``mask & keep`` for a block ``mask`` and a scalar ``keep``, as a select: Triton 3.9's
    interpreter makes the ``&`` of the two an int32 block, which its stores reject."""
    return tl.where(keep, mask, False)


@triton.jit
def _gates(g_ptr, beta_ptr, alog_ptr, dtb_ptr, off, h, RAW: tl.constexpr):
    """(g, beta) of one token and value head h: loaded, or from the projections a, b."""
    if RAW:
        a = tl.load(g_ptr + off).to(tl.float32) + tl.load(dtb_ptr + h).to(tl.float32)
        g = -tl.exp(tl.load(alog_ptr + h).to(tl.float32)) * _softplus(a)
        beta = tl.sigmoid(tl.load(beta_ptr + off).to(tl.float32))
    else:
        g = tl.load(g_ptr + off).to(tl.float32)
        beta = tl.load(beta_ptr + off).to(tl.float32)
    return g, beta


# The tokens per sequence ``T`` is a runtime loop bound, not specialized on: as a constexpr each
# padded query length of an eager step (prefill tails of 2..16 tokens at 64 requests) compiled
# both kernels anew at use (H200: 0.3-0.4 s each, benchmarks/gpu_mtp_load.py); so did the
# alignment of the gate projections, views at offsets that vary, and their batch stride
# T * Hv (kernels/jit_options.py).
@triton.jit(**unspecialized(ints=("T", "sg_b"), pointers=("g_ptr", "beta_ptr")))
def _recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, pool_ptr,
                      slots_ptr, last_ptr, out_ptr, scratch_ptr, rows_ptr, scale,
                      sq_b, sq_t, sq_h, sv_b, sv_t, sv_h, sg_b, sg_t, sg_k, sg_r,
                      so_b, so_t, so_h, sp, ss_r, ss_t, T,
                      R: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr, RAW: tl.constexpr, SCRATCH: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    hk = h // R
    ik = tl.arange(0, BK)
    iv = tl.program_id(2) * BV + tl.arange(0, BV)
    kmask, vmask = ik < DK, iv < DV
    smask = kmask[:, None] & vmask[None, :]
    s_off = h * DK * DV + ik[:, None] * DV + iv[None, :]
    slot = tl.load(slots_ptr + b)
    last = tl.load(last_ptr + b)
    s = tl.load(pool_ptr + slot * sp + s_off, mask=smask, other=0.0).to(tl.float32)
    row = tl.load(rows_ptr + b) if SCRATCH else -1
    for t in range(T):
        qk_off = b * sq_b + t * sq_t + hk * sq_h + ik
        q = _l2norm(tl.load(q_ptr + qk_off, mask=kmask, other=0.0).to(tl.float32), 1e-6) * scale
        k = _l2norm(tl.load(k_ptr + qk_off, mask=kmask, other=0.0).to(tl.float32), 1e-6)
        v = tl.load(v_ptr + b * sv_b + t * sv_t + h * sv_h + iv, mask=vmask,
                    other=0.0).to(tl.float32)
        g, beta = _gates(g_ptr, beta_ptr, alog_ptr, dtb_ptr,
                         b * sg_b + t * sg_t + hk * sg_k + (h % R) * sg_r, h, RAW)
        real = t <= last
        g = tl.where(real, g, 0.0)
        beta = tl.where(real, beta, 0.0)
        s = s * tl.exp(g)
        u = beta * (v - tl.sum(s * k[:, None], axis=0))
        s = s + k[:, None] * u[None, :]
        o = tl.sum(s * q[:, None], axis=0)
        tl.store(out_ptr + b * so_b + t * so_t + h * so_h + iv, o.to(out_ptr.dtype.element_ty),
                 mask=vmask)
        if SCRATCH:
            tl.store(scratch_ptr + row * ss_r + t * ss_t + s_off,
                     s.to(scratch_ptr.dtype.element_ty), mask=_masked(smask, real & (row >= 0)))
    tl.store(pool_ptr + slot * sp + s_off, s.to(pool_ptr.dtype.element_ty), mask=smask)


def _block_v(programs_per_block: int, dv: int) -> int:
    """Value columns per program: up to 32 ([128, 32] float32 state tile = 32 registers a thread
    at 4 warps), halved down to 8 while the grid has under ~4 programs per H200 SM."""
    bv = min(32, triton.next_power_of_2(dv))
    while bv > 8 and programs_per_block * triton.cdiv(dv, bv) < 512:
        bv //= 2
    return bv


def _check_state(buf: torch.Tensor, name: str, inner: tuple) -> None:
    """Raise ValueError unless ``buf``'s trailing dims are ``inner``, laid out contiguously."""
    strides, n = [], 1
    for size in reversed(inner):
        strides.insert(0, n)
        n *= size
    if tuple(buf.shape[-len(inner):]) != inner or list(buf.stride()[-len(inner):]) != strides:
        raise ValueError(f"{name} {tuple(buf.shape)} must end in contiguous {inner}")


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, ssm_pool, slots, out, *, last=None,
                                     scratch=None, scratch_rows=None, gate_params=None,
                                     block_v=None):
    """Gated delta rule over a padded block of short sequences, states read from and written
    back to their slots in place.

    Args:
        q, k: [Bs, T, Hk, Dk], any float dtype, any strides but unit stride in the last dim.
        v: [Bs, T, Hv, Dv], Hv a multiple of Hk (value head h reads key head h // (Hv // Hk)).
        g, beta: [Bs, T, Hv] log decay (<= 0) and write strength, float32. With
            ``gate_params=(A_log, dt_bias)`` ([Hv] each) they are instead the raw projections
            ``a`` and ``b`` ([Bs, T, Hv] or [Bs, T, Hk, Hv // Hk], any float dtype and strides),
            and the kernel uses ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta =
            sigmoid(b)``.
        ssm_pool: [slots + 1, Hv, Dk, Dv] (float32 in the engine): sequence b starts from
            ``ssm_pool[slots[b]]`` and leaves its state after its last real token there.
        slots: [Bs] int64 (distinct, except for padding sequences sharing a junk slot).
        out: [Bs, T, Hv, Dv] output (any float dtype, unit stride in the last dim), written.
        last: [Bs] int64 index of each sequence's last real token (None: all T tokens are real);
            later tokens are padding (g = beta = 0, no state written).
        scratch: [rows, P, Hv, Dk, Dv] (one layer's ``ssm_scratch``) with ``scratch_rows`` [Bs]
            int64: the state after each real token t goes to ``scratch[scratch_rows[b], t]``
            (row < 0: not written; P must exceed every ``last[b]``).
        block_v: value columns per program (default: by grid size, see ``_block_v``).

    Raises:
        ValueError: on inconsistent shapes or state buffers that are not contiguous per slot.
    """
    Bs, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    if k.shape != q.shape or v.shape[:2] != (Bs, T) or Hv % Hk or out.shape != v.shape:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"out {tuple(out.shape)} do not fit together")
    _check_state(ssm_pool, "ssm_pool", (Hv, Dk, Dv))
    if q.stride() != k.stride() or q.stride(-1) != 1:
        q, k = q.contiguous(), k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    if out.stride(-1) != 1:
        raise ValueError("out needs unit stride in its last dim")
    R = Hv // Hk
    g, beta = (x.unflatten(-1, (Hk, R)) if x.dim() == 3 else x for x in (g, beta))
    if g.shape != (Bs, T, Hk, R) or beta.shape != g.shape:
        raise ValueError(f"gates {tuple(g.shape)}, {tuple(beta.shape)} do not fit v")
    if g.stride() != beta.stride():
        g, beta = g.contiguous(), beta.contiguous()
    raw = gate_params is not None
    alog, dtb = gate_params if raw else (g, g)
    if last is None:
        last = torch.full((Bs,), T - 1, dtype=torch.int64, device=q.device)
    use_scratch = scratch is not None
    if use_scratch:
        _check_state(scratch, "scratch", (Hv, Dk, Dv))
    sc, rows = (scratch, scratch_rows) if use_scratch else (ssm_pool, slots)
    bv = block_v or _block_v(Bs * Hv, Dv)
    grid = (Bs, Hv, triton.cdiv(Dv, bv))
    _recurrent_kernel[grid](
        q, k, v, g, beta, alog, dtb, ssm_pool, slots, last, out, sc, rows, Dk ** -0.5,
        q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2),
        *g.stride(), out.stride(0), out.stride(1), out.stride(2), ssm_pool.stride(0),
        sc.stride(0), sc.stride(1) if use_scratch else 0, T=T,
        R=R, DK=Dk, DV=Dv, BK=triton.next_power_of_2(Dk), BV=bv, RAW=raw, SCRATCH=use_scratch,
        num_warps=max(1, bv // 8), **pdl.launch(q))
    return out


@triton.jit
def _window(state_ptrs, x_ptrs, sx_t, j, mask, K: tl.constexpr):
    """Column j of a sequence's conv window (the K-1 state columns, then the new inputs), in
    x's dtype, as float32: a [BC] vector."""
    from_state = j < K - 1
    s = tl.load(state_ptrs + j, mask=mask & from_state, other=0.0).to(x_ptrs.dtype.element_ty)
    x = tl.load(x_ptrs + (j - (K - 1)) * sx_t, mask=mask & (j >= K - 1), other=0.0)
    return tl.where(from_state, s, x).to(tl.float32)


@triton.jit(**unspecialized(ints=("T",)))
def _conv_kernel(x_ptr, w_ptr, pool_ptr, slots_ptr, last_ptr, y_ptr, scratch_ptr, rows_ptr, C,
                 sx_b, sx_t, sy_b, sy_t, sp, ss_r, ss_t, T, K: tl.constexpr,
                 KP: tl.constexpr, BC: tl.constexpr, SCRATCH: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    cm = c < C
    XT = x_ptr.dtype.element_ty
    slot = tl.load(slots_ptr + b)
    last = tl.load(last_ptr + b)
    state_ptrs = pool_ptr + slot * sp + c * (K - 1)
    x_ptrs = x_ptr + b * sx_b + c
    row = tl.load(rows_ptr + b) if SCRATCH else -1
    for t in range(T):
        acc = tl.zeros([BC], dtype=tl.float32)
        for j in tl.static_range(K):
            col = _window(state_ptrs, x_ptrs, sx_t, t + j, cm, K)
            acc += col * tl.load(w_ptr + c * K + j, mask=cm, other=0.0).to(XT).to(tl.float32)
            if SCRATCH:
                if j > 0:             # the state after token t: window columns t+1 .. t+K-1
                    tl.store(scratch_ptr + row * ss_r + t * ss_t + c * (K - 1) + (j - 1),
                             col.to(scratch_ptr.dtype.element_ty),
                             mask=_masked(cm, (t <= last) & (row >= 0)))
        y = acc / (1.0 + tl.exp(-acc))
        tl.store(y_ptr + b * sy_b + t * sy_t + c, y.to(y_ptr.dtype.element_ty), mask=cm)
    # the state after the last real token: window columns last+1 .. last+K-1, as a [BC, KP] tile
    i = tl.arange(0, KP)
    j = last + 1 + i[None, :]
    m = cm[:, None] & (i[None, :] < K - 1)
    old = tl.load(state_ptrs[:, None] + j, mask=m & (j < K - 1), other=0.0).to(XT)
    new = tl.load(x_ptrs[:, None] + (j - (K - 1)) * sx_t, mask=m & (j >= K - 1), other=0.0)
    keep = tl.where(j < K - 1, old, new)
    tl.debug_barrier()                # every read of the old state is done before it is replaced
    tl.store(state_ptrs[:, None] + i[None, :], keep.to(pool_ptr.dtype.element_ty), mask=m)


def fused_causal_conv1d(x, weight, conv_pool, slots, last, scratch=None, scratch_rows=None,
                        block_c=256):
    """Depthwise causal convolution with SiLU (no bias) of a padded block, conv states read from
    and written back to their slots in place.

    Args:
        x: [Bs, T, C] new inputs (any float dtype and strides, unit stride in the last dim).
        weight: [C, K] (rounded to x's dtype as the reference does).
        conv_pool: [slots + 1, C, K-1] (model dtype): sequence b starts from ``conv_pool[slots[b]]``
            (the previous K-1 inputs in time order) and leaves the K-1 inputs up to its last real
            token there.
        slots, last: [Bs] int64 state slot and index of the last real token of each sequence.
        scratch: [rows, P, C, K-1] (one layer's ``conv_scratch``) with ``scratch_rows`` [Bs] int64:
            the conv state after each real token t goes to ``scratch[scratch_rows[b], t]`` (row < 0:
            not written; P must exceed every ``last[b]``).

    Returns:
        [Bs, T, C] in x's dtype: ``silu(sum_j weight[c, j] * window[t + j, c])`` over the window
        (state, then x), equal to :func:`~mtpserve.kernels.gated_delta_rule.causal_conv1d`.

    Raises:
        ValueError: on inconsistent shapes or state buffers that are not contiguous per slot.
    """
    Bs, T, C = x.shape
    K = weight.shape[1]
    if weight.shape[0] != C or K < 2:
        raise ValueError(f"weight {tuple(weight.shape)} does not fit x {tuple(x.shape)}")
    _check_state(conv_pool, "conv_pool", (C, K - 1))
    if x.stride(-1) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    y = torch.empty(Bs, T, C, dtype=x.dtype, device=x.device)
    use_scratch = scratch is not None
    if use_scratch:
        _check_state(scratch, "scratch", (C, K - 1))
    sc, rows = (scratch, scratch_rows) if use_scratch else (conv_pool, slots)
    bc = min(block_c, triton.next_power_of_2(C))
    _conv_kernel[(Bs, triton.cdiv(C, bc))](
        x, weight, conv_pool, slots, last, y, sc, rows, C, x.stride(0), x.stride(1),
        y.stride(0), y.stride(1), conv_pool.stride(0), sc.stride(0), sc.stride(1) if use_scratch
        else 0, T=T, K=K, KP=triton.next_power_of_2(K - 1), BC=bc, SCRATCH=use_scratch,
        num_warps=max(1, min(4, bc // 64)), **pdl.launch(x))
    return y
