"""Row argmax of a few long float rows in one kernel: the greedy choice over an LM head's logits.

A draft head's logits are one row of 32k-152k values. PyTorch's reduction runs such a row on few
blocks: 9-11.5 us on the H200 (session 30's step traces), about as long as the FR-Spec head's
product itself, three times per MTP step. Here the row is cut into ``programs`` chunks, each
program keeps its chunk's max and the lowest index reaching it, and the last program of the row
to arrive (kernels/arrival.py, the split-K "serial fix-up") combines the partials in chunk
order: one launch, the row read once by many SMs.

Ties go to the lowest index and a NaN counts above every number (its first index wins), as in
``torch.argmax``; a row of only -inf gives 0. Inside kernels/compile_ahead.py's dry forwards
(kernels compile, nothing runs) the result is zeros, a valid index for whatever reads it.
With ``id_map`` [N] int64 the result is ``id_map[argmax]`` (FR-Spec's subset head:
spec/draft_head.py), in the same launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import arrival, compile_ahead
from mtpserve.kernels.jit_options import unspecialized

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
BLOCK = 1024            # values a program reads per step
MAX_PROGRAMS = 64       # programs per row (at most; fewer for shorter rows)


@triton.jit
def _best(v, k, N):
    """(rank, value, index) of the largest of ``v`` (indices ``k``): a NaN ranks above every
    number (rank 1, value +inf), as in ``torch.argmax``; ties go to the lowest index."""
    nan = v != v
    rank = tl.max(nan.to(tl.int32), 0)
    key = tl.where(nan, float("inf"), v)
    m = tl.max(tl.where(nan.to(tl.int32) == rank, key, -float("inf")), 0)
    i = tl.min(tl.where((nan.to(tl.int32) == rank) & (key == m), k, N), 0)
    return rank, m, i


@triton.jit(**unspecialized(ints=("N", "sx", "chunk"), pointers=("x_ptr",)))
def _argmax_kernel(x_ptr, part_v_ptr, part_i_ptr, count_ptr, map_ptr, out_ptr, N, sx, chunk,
                   PROGRAMS: tl.constexpr, BLOCK: tl.constexpr, HAS_MAP: tl.constexpr):
    pid, row = tl.program_id(0), tl.program_id(1)
    start = pid * chunk
    end = tl.minimum(start + chunk, N)
    best_r = 0
    best_v = -float("inf")
    best_i = start                   # a chunk of -inf only: its first index
    for k0 in tl.range(start, end, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + row.to(tl.int64) * sx + k, mask=k < end,
                    other=-float("inf")).to(tl.float32)
        r, m, i = _best(v, k, N)
        # strictly better: an earlier block keeps a tie
        take = (r > best_r) | ((r == best_r) & (m > best_v))
        best_i = tl.where(take, i, best_i)
        best_v = tl.where(take, m, best_v)
        best_r = tl.where(take, r, best_r)
    # a NaN chunk's partial is stored as NaN, so the fix-up below ranks it first again
    tl.store(part_v_ptr + row * PROGRAMS + pid,
             tl.where(best_r > 0, float("nan"), best_v))
    tl.store(part_i_ptr + row * PROGRAMS + pid, best_i)
    if arrival.arrive_last(count_ptr + row, tl.num_programs(0)):
        p = tl.arange(0, PROGRAMS)
        live = p < tl.num_programs(0)
        pv = tl.load(part_v_ptr + row * PROGRAMS + p, mask=live, other=-float("inf"),
                     cache_modifier=".cg")
        pi = tl.load(part_i_ptr + row * PROGRAMS + p, mask=live, other=0, cache_modifier=".cg")
        _, _, j = _best(pv, p, PROGRAMS)     # chunks in index order: the lowest wins
        idx = tl.sum(tl.where(p == j, pi, 0), 0)
        if HAS_MAP:
            idx = tl.load(map_ptr + idx)
        tl.store(out_ptr + row, idx.to(tl.int64))


def row_argmax(x: torch.Tensor, id_map: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Per row of ``x`` [M, N] float32, bfloat16 or float16 (rows contiguous), the index of its
    largest value, ties to the lowest, a NaN above all (module doc): ``torch.argmax(x, -1)``
    [M] int64; with ``id_map`` [N] int64, ``id_map[argmax]`` (int64 whatever ``id_map``'s
    integer dtype). ``out``: a contiguous [M] int64 tensor to write instead of a new one. Off
    CUDA (and under no Triton) the PyTorch ops. Raises ``ValueError`` for another dtype or
    shape of ``x`` or ``out``, or more rows than the arrival counters hold."""
    if x.dim() != 2 or x.dtype not in _FLOATS or x.stride(-1) != 1 or x.shape[1] == 0:
        raise ValueError(f"row_argmax: needs [M, N > 0] float rows, contiguous along N; got "
                         f"{tuple(x.shape)} {x.dtype} strides {x.stride()}")
    M, N = x.shape
    if out is not None and (out.shape != (M,) or out.dtype != torch.int64
                            or not out.is_contiguous()):
        raise ValueError(f"row_argmax: out must be a contiguous [{M}] int64 tensor; got "
                         f"{tuple(out.shape)} {out.dtype} strides {out.stride()}")
    if id_map is not None:   # a contiguous int64 row (no copy when it is one already)
        id_map = id_map.to(torch.int64).contiguous()
    if not _on_triton(x) or M == 0:
        idx = torch.argmax(x, -1)
        idx = idx if id_map is None else id_map.index_select(0, idx)
        return idx if out is None else out.copy_(idx)
    if out is None:
        out = torch.empty(M, dtype=torch.int64, device=x.device)
    if M > arrival.NUM_COUNTERS:
        raise ValueError(f"row_argmax: {M} rows is more than the arrival counters hold")
    programs = min(MAX_PROGRAMS, triton.cdiv(N, BLOCK))
    chunk = triton.cdiv(triton.cdiv(N, programs), BLOCK) * BLOCK
    programs = triton.cdiv(N, chunk)
    part_v = torch.empty(M, MAX_PROGRAMS, dtype=torch.float32, device=x.device)
    part_i = torch.empty(M, MAX_PROGRAMS, dtype=torch.int32, device=x.device)
    _argmax_kernel[(programs, M)](
        x, part_v, part_i, arrival.counters(x.device), id_map if id_map is not None else out,
        out, N, x.stride(0), chunk, PROGRAMS=MAX_PROGRAMS, BLOCK=BLOCK,
        HAS_MAP=id_map is not None)
    if compile_ahead.dry():      # compiled, not run: ids that index safely
        out.zero_()
    return out


def _on_triton(x: torch.Tensor) -> bool:
    from mtpserve.kernels.dispatch import INTERPRET, use_triton

    return use_triton(x) or INTERPRET
