"""Streamed one-row products on CUDA (Triton): ``y = x W^T`` for one row of ``x`` in one wave.

A batch-1 decode step is a chain of products, each waiting (PDL, kernels/pdl.py) for the kernel
before it. The weight never depends on that kernel, so a program can load weight bytes before
its wait; kernels/gemv_triton.py's preloaded tiles do so where a product's tiles of 16 rows fit
in one wave of registers (the 1.7B o product: 5.66 -> 3.62 us in a chain, BENCHMARKS.md session
22), and a product of several waves gains nothing from it: only the first wave's programs are
resident early, and the later waves start cold.

Here a product of any size is one wave of ``G`` programs (a few per SM). The weight's rows are cut
into blocks of ``BLOCK_N`` rows, each block into chunks of ``BLOCK_K`` inputs (a *unit*); program
``p`` owns the row blocks ``p, p + G, p + 2G, ...`` and goes through their units in order, with
one unit in registers being multiplied while the next one loads (a register double buffer). The
first unit is loaded before the PDL wait. Each unit is kept 16-bit in registers until it is
multiplied (``late_f32``), so two units fit. Float32 multiply and sum over each row of the unit,
the units' sums added in order of the reduction; one rounding to the output dtype. The bits
differ from the tiled kernel's (another order of the sum), and a row's bits do not depend on G.

Inputs fused in front (after the wait, while the first unit is already in registers): the
residual add + RMSNorm of the pre-norm decoder (:class:`NormInput`: the q/k/v and gate/up
products) and SiLU-and-mul of a gate/up output (``silu_input``: the down product). Each takes a
kernel and its PDL boundary out of the batch-1 step; every program computes the same input (K
values, from L2), and program 0 stores the new residual. Measured and removed (session 23,
commit 41fe97e): the o product merging one token's attention partitions the same way, in place
of the merge kernel, made the step slower (1.7B 1.306 -> 1.335-1.343 ms, 8B 4.028 -> 4.19):
every program read all partitions' float32 partial outputs. Also measured and removed (session
24, commit a974e81): streaming 2 to 4 rows the same way, each unit multiplied by every row in
float32 multiply-and-sum: compute-bound at 4 rows (1.7B gate/up 25.5 us against 13.8 in tiles
with ``tl.dot``; a 4-token verify forward took 1.84x a decode step's time against 1.19x).

On the H200 (BENCHMARKS.md, session 23), one product in a chain of 20: 1.7B q/k/v 6.69 -> 5.68
us, gate/up 13.57 -> 13.14, down 9.62 -> 8.61; 8B q/k/v 16.41 -> 13.67, o 10.96 -> 9.59, down
25.74 -> 24.79. Batch-1 step: 1.7B 1.440 -> 1.398 ms streamed, 1.304 with the norms and the
SiLU-and-mul fused; 8B 4.342 -> 4.197 -> 4.028.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mtpserve.kernels import pdl
from mtpserve.kernels.pdl import pdl_wait


@functools.cache
def sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index``."""
    return torch.cuda.get_device_properties(index).multi_processor_count


@triton.jit
def late_f32(w):
    """16-bit bfloat16 ``w`` -> float32, as an asm statement with side effects: the compiler
    neither converts before the PDL wait nor ahead of use, so a unit waits in registers at half
    the size (checked on the PTX for sm_90: 100 instead of 172 registers for a 16 x 2048 tile at
    8 warps). Widening bfloat16 is exact: its bits are float32's upper half."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; mov.b32 $0, {0, lo}; mov.b32 $1, {0, hi}; }",
        "=r,=r,r", [w], dtype=tl.float32, is_pure=False, pack=2)


@triton.jit
def to_f32(w, LATE: tl.constexpr):
    """``w`` as float32: through :func:`late_f32` when LATE (CUDA, bfloat16), else a cast (the
    CPU interpreter runs no asm)."""
    if LATE:
        return late_f32(w)
    else:
        return w.to(tl.float32)


@triton.jit
def _load_unit(w_ptr, sw, N, u, pid, G, r, c, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """Unit ``u`` of program ``pid``: rows of block ``pid + (u // CHUNKS) * G``, inputs of chunk
    ``u % CHUNKS``; [BLOCK_N, BLOCK_K] in the weight's dtype (rows past N read as zero)."""
    rows = (pid + (u // CHUNKS) * G) * BLOCK_N + r
    cols = (u % CHUNKS) * BLOCK_K + c
    return tl.load(w_ptr + rows[:, None].to(tl.int64) * sw + cols[None, :],
                   mask=(rows < N)[:, None], other=0.0)


@triton.jit
def _unit_dot(w, x, LATE: tl.constexpr):
    """[BLOCK_N] float32: unit ``w`` [BLOCK_N, BLOCK_K] times ``x`` [BLOCK_K] float32."""
    return tl.sum(to_f32(w, LATE) * x[None, :], axis=1)


@triton.jit
def _x_chunk(x_ptr, chunk, c, K: tl.constexpr, BLOCK_K: tl.constexpr, SILU: tl.constexpr):
    """Chunk ``chunk`` of the product's input as float32 [BLOCK_K]: x itself, or with SILU
    ``silu(g) * u`` of x = [gate | up] (2K wide), rounded to x's dtype as
    ``fused_triton.silu_and_mul`` stores it (so the same bits as that kernel then the product)."""
    cols = chunk * BLOCK_K + c
    if SILU:
        g = tl.load(x_ptr + cols).to(tl.float32)
        u = tl.load(x_ptr + K + cols).to(tl.float32)
        return (g / (1.0 + tl.exp(-g)) * u).to(x_ptr.dtype.element_ty).to(tl.float32)
    else:
        return tl.load(x_ptr + cols).to(tl.float32)


@triton.jit
def _normed_x(x_ptr, r_ptr, nw_ptr, ro_ptr, eps, c, K: tl.constexpr):
    """The residual add + RMSNorm in front of the product (``fused_triton.add_rms_norm``'s
    arithmetic): ``s = r + x`` rounded to x's dtype, stored to ``ro`` by program 0 (the new
    residual), and ``s / sqrt(mean(s^2) + eps) * w`` rounded to x's dtype, as float32 [K]."""
    dt = x_ptr.dtype.element_ty
    s = (tl.load(r_ptr + c).to(tl.float32) + tl.load(x_ptr + c).to(tl.float32)).to(dt)
    if tl.program_id(0) == 0:
        tl.store(ro_ptr + c, s)
    s = s.to(tl.float32)
    scale = tl.rsqrt(tl.sum(s * s, axis=0) / K + eps)
    return (s * scale * tl.load(nw_ptr + c).to(tl.float32)).to(dt).to(tl.float32)


@triton.jit
def gated_weigh(normed, w, z, dt: tl.constexpr):
    """The Gated DeltaNet output norm's tail, float32 in, float32 out: ``normed`` (the RMS-normed
    x, already rounded to ``dt``) times the weight ``w``, rounded to ``dt``, times ``silu(z)``;
    the caller rounds the result. Shared by ``fused_triton``'s gated norm kernel and the
    streamed product's prologue, so that both round alike."""
    weighted = (w * normed).to(dt).to(tl.float32)
    return weighted * (z / (1.0 + tl.exp(-z)))


@triton.jit
def _gated_normed_chunk(x_ptr, z_ptr, nw_ptr, eps, chunk, c, BLOCK_K: tl.constexpr,
                        D: tl.constexpr):
    """Chunk ``chunk`` of ``rmsnorm(x) * w * silu(z)`` over heads of D inputs (the Gated
    DeltaNet's output norm, ``fused_triton.gated_rms_norm``'s arithmetic and roundings; D divides
    BLOCK_K), as float32 [BLOCK_K]."""
    dt = x_ptr.dtype.element_ty
    cols = chunk * BLOCK_K + c
    x = tl.reshape(tl.load(x_ptr + cols).to(tl.float32), (BLOCK_K // D, D))
    scale = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
    normed = tl.reshape((x * scale[:, None]).to(dt), (BLOCK_K,)).to(tl.float32)
    y = gated_weigh(normed, tl.load(nw_ptr + cols % D).to(tl.float32),
                    tl.load(z_ptr + cols).to(tl.float32), dt)
    return y.to(dt).to(tl.float32)


@triton.jit
def _input_chunk(x_ptr, r_ptr, nw_ptr, eps, chunk, c, K: tl.constexpr, BLOCK_K: tl.constexpr,
                 D: tl.constexpr, PROLOGUE: tl.constexpr):
    """Chunk ``chunk`` of the product's input, float32 [BLOCK_K]: x (PROLOGUE 0), SiLU-and-mul
    of it (1), or its gated per-head norm with r the gate z (3)."""
    if PROLOGUE == 3:
        return _gated_normed_chunk(x_ptr, r_ptr, nw_ptr, eps, chunk, c, BLOCK_K, D)
    else:
        return _x_chunk(x_ptr, chunk, c, K, BLOCK_K, PROLOGUE == 1)


@triton.jit
def _stream_kernel(x_ptr, w_ptr, b_ptr, y_ptr, r_ptr, nw_ptr, ro_ptr, eps, N, sw,
                   K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr, PROLOGUE: tl.constexpr,
                   D: tl.constexpr, LATE: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    CHUNKS: tl.constexpr = K // BLOCK_K
    units = ((tl.cdiv(N, BLOCK_N) - 1 - pid) // G + 1) * CHUNKS
    r = tl.arange(0, BLOCK_N)
    c = tl.arange(0, BLOCK_K)
    w = _load_unit(w_ptr, sw, N, 0, pid, G, r, c, CHUNKS, BLOCK_N, BLOCK_K)
    pdl_wait(PDL)
    if PROLOGUE == 2:   # the whole input normed once (BLOCK_K == K)
        x = _normed_x(x_ptr, r_ptr, nw_ptr, ro_ptr, eps, c, K)
    else:
        x = _input_chunk(x_ptr, r_ptr, nw_ptr, eps, 0, c, K, BLOCK_K, D, PROLOGUE)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for u in range(1, units):
        w_next = _load_unit(w_ptr, sw, N, u, pid, G, r, c, CHUNKS, BLOCK_N, BLOCK_K)
        acc += _unit_dot(w, x, LATE)
        if CHUNKS > 1:
            x = _input_chunk(x_ptr, r_ptr, nw_ptr, eps, u % CHUNKS, c, K, BLOCK_K, D,
                             PROLOGUE)
        if u % CHUNKS == 0:   # unit u - 1 ended its row block
            _store_rows(acc, b_ptr, y_ptr, N, pid + (u // CHUNKS - 1) * G, r, BLOCK_N, HAS_BIAS,
                        SWIGLU)
            acc = tl.zeros([BLOCK_N], tl.float32)
        w = w_next
    acc += _unit_dot(w, x, LATE)
    _store_rows(acc, b_ptr, y_ptr, N, pid + (units // CHUNKS - 1) * G, r, BLOCK_N, HAS_BIAS,
                SWIGLU)


@triton.jit
def _store_rows(acc, b_ptr, y_ptr, N, block, r, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
                SWIGLU: tl.constexpr):
    """Row block ``block``'s outputs: ``acc`` [BLOCK_N] float32 (+ bias), rounded to y's dtype;
    with SWIGLU, ``silu(g) * u`` of its interleaved (gate, up) pairs into y [N / 2], computed as
    gemv_triton's SwiGLU epilogue does (the same bits for the same products)."""
    rows = block * BLOCK_N + r
    mask = rows < N
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=mask, other=0.0).to(tl.float32)
    if SWIGLU:
        h = acc.to(y_ptr.dtype.element_ty).to(tl.float32)
        g, u = tl.split(tl.reshape(h, (BLOCK_N // 2, 2)))
        j = block * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(y_ptr + j, (g / (1.0 + tl.exp(-g)) * u).to(y_ptr.dtype.element_ty),
                 mask=j < N // 2)
    else:
        tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=mask)


@dataclass
class NormInput:
    """The product's input as a residual add + RMSNorm still to be done (the pre-norm decoder's
    ``add_rms_norm(x, residual)`` in front of a product, fused into its programs): ``x`` and
    ``residual`` [1, K] of one dtype, the norm ``weight`` [K] (``w``, not ``w - 1``), ``eps``.
    The product stores ``residual + x`` (rounded to x's dtype) to ``residual_out`` [1, K]."""
    x: torch.Tensor
    residual: torch.Tensor
    weight: torch.Tensor
    eps: float
    residual_out: torch.Tensor


@dataclass
class GatedNormInput:
    """The product's input as the Gated DeltaNet's output norm still to be done
    (``rmsnorm(x) * weight * silu(z)`` per head of D = ``weight``'s size, in front of its
    out_proj, fused into the product's programs): ``x`` and ``z`` [1, K] of one dtype, unit
    stride along K (K a multiple of D), ``weight`` [D], ``eps``."""
    x: torch.Tensor
    z: torch.Tensor
    weight: torch.Tensor
    eps: float


def gemv_stream(x: torch.Tensor | NormInput | GatedNormInput, weight: torch.Tensor,
                bias: torch.Tensor | None = None, block_n: int = 16, block_k: int = 2048,
                num_warps: int = 8, programs: int | None = None, swiglu: bool = False,
                out_dtype: torch.dtype | None = None, silu_input: bool = False,
                maxnreg: int | None = None) -> torch.Tensor:
    """``x [1, K] @ weight[N, K]^T (+ bias [N])`` -> [1, N] in ``out_dtype`` (default x's),
    streamed in one wave (module doc). ``block_n`` x ``block_k`` is a unit (``block_k`` a power
    of two dividing K); ``programs``: the grid (default two per SM, at most one per row block).
    ``swiglu``: the weight's rows are interleaved (gate j, up j) and the result is
    ``silu(g) * u`` [1, N / 2] (gemv_triton's SwiGLU epilogue). ``maxnreg``: registers a
    thread may use (CUDA), so that the programs meant to share an SM fit.

    Fused in front: ``silu_input``: ``x`` is [1, 2K] = [gate | up] and the product takes
    ``silu(gate) * up`` (the same bits as ``fused_triton.silu_and_mul`` then the product); a
    :class:`NormInput` (needs ``block_k == K``): the product takes the normed residual sum and
    writes the new residual (close to, not always bit-equal with, ``add_rms_norm`` then the
    product: its sum of squares is reduced in another order); a :class:`GatedNormInput` (heads
    of D inputs; D must divide ``block_k``): the product takes the gated per-head norm (close
    to ``fused_triton.gated_rms_norm`` then the product, for the same reason).

    Raises ``ValueError`` for more than one row, an x of another width, a weight not contiguous
    along K, a ``block_k`` that does not divide K, ``swiglu`` with a bias or an odd N, or a
    NormInput over chunks shorter than K, a GatedNormInput whose heads do not divide them, or
    either of mismatched shapes."""
    N, K = weight.shape
    x, r, nw, ro, eps, prologue, D = _prologue_operands(x, K, block_k, silu_input)
    if weight.stride(-1) != 1 or K % block_k:
        raise ValueError(f"gemv_stream needs a weight contiguous along K and chunks of {block_k} "
                         f"that divide K = {K}")
    if swiglu and (bias is not None or N % 2):
        raise ValueError(f"gemv_stream: SwiGLU takes an even number of rows without bias (N {N})")
    blocks = triton.cdiv(N, block_n)
    if programs is None:
        programs = 2 * sm_count(x.device.index or 0) if x.is_cuda else 4
    y = torch.empty(1, N // 2 if swiglu else N, dtype=out_dtype or x.dtype, device=x.device)
    _stream_kernel[(min(programs, blocks),)](
        x, weight, bias if bias is not None else weight, y, r, nw, ro, eps, N, weight.stride(0),
        K=K, BLOCK_N=block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None, SWIGLU=swiglu,
        PROLOGUE=prologue, D=D, LATE=x.is_cuda and weight.dtype == torch.bfloat16,
        num_warps=num_warps, **({"maxnreg": maxnreg} if maxnreg and x.is_cuda else {}),
        **pdl.launch(x))
    return y


def _prologue_operands(x, K: int, block_k: int, silu_input: bool):
    """``gemv_stream``'s input operands (x, r, nw, ro, eps, PROLOGUE, D) for a plain or SiLU
    input (0 / 1), a :class:`NormInput` (2) or a :class:`GatedNormInput` (3); raises
    ``ValueError`` where they do not fit (see ``gemv_stream``)."""
    norm = x if isinstance(x, NormInput) else None
    gated = x if isinstance(x, GatedNormInput) else None
    x = (norm or gated).x if norm or gated else x
    if x.dim() != 2 or x.shape[0] != 1 or x.shape[1] != (2 * K if silu_input else K):
        raise ValueError(f"gemv_stream takes one row of {K} inputs"
                         f"{' (x 2) for silu_input' if silu_input else ''}, got {tuple(x.shape)}")
    if norm:
        if (block_k != K or silu_input or norm.residual.shape != x.shape
                or norm.residual_out.shape != x.shape or norm.weight.shape != (K,)
                or not norm.residual_out.is_contiguous()):
            raise ValueError(f"gemv_stream: a NormInput needs one chunk of all K = {K} inputs "
                             f"(block_k {block_k}) and residuals [1, K], residual_out contiguous")
        return (x.contiguous(), norm.residual.contiguous(), norm.weight, norm.residual_out,
                norm.eps, 2, 1)
    if gated:
        D = gated.weight.numel()
        if (silu_input or gated.weight.dim() != 1 or block_k % D or gated.z.shape != x.shape
                or x.stride(1) != 1 or gated.z.stride(1) != 1 or gated.z.dtype != x.dtype):
            raise ValueError(f"gemv_stream: a GatedNormInput needs x and z [1, {K}] of one "
                             f"dtype with unit stride and heads (D {D}) that divide chunks of "
                             f"{block_k}")
        return x, gated.z, gated.weight.contiguous(), x, gated.eps, 3, D
    x = x.contiguous()
    return x, x, x, x, 0.0, int(silu_input), 1
