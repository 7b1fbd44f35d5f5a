"""Row argmax of a few long float rows in one kernel: the greedy choice over an LM head's logits.

A draft head's logits are one row of 32k-152k values. PyTorch's reduction runs such a row on few
blocks: 9-11.5 us on the H200 (session 30's step traces), about as long as the FR-Spec head's
product itself, three times per MTP step. Here the row is cut into ``programs`` chunks, each
program keeps its chunk's max and the lowest index reaching it, and the last program of the row
to arrive (kernels/arrival.py, the split-K "serial fix-up") combines the partials in chunk
order: one launch, the row read once by many SMs.

Ties go to the lowest index, as ``torch.argmax``. Rows are assumed free of NaN (logits are):
``torch.argmax`` returns a NaN's index, this kernel the largest number's. A row of only -inf
gives 0, as ``torch.argmax``. With ``id_map`` [N] int64 the result is ``id_map[argmax]``
(FR-Spec's subset head: spec/draft_head.py), in the same launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels import arrival
from mtpserve.kernels.jit_options import unspecialized

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
BLOCK = 1024            # values a program reads per step
MAX_PROGRAMS = 64       # programs per row (at most; fewer for shorter rows)


@triton.jit(**unspecialized(ints=("N", "sx", "chunk"), pointers=("x_ptr",)))
def _argmax_kernel(x_ptr, part_v_ptr, part_i_ptr, count_ptr, map_ptr, out_ptr, N, sx, chunk,
                   PROGRAMS: tl.constexpr, BLOCK: tl.constexpr, HAS_MAP: tl.constexpr):
    pid, row = tl.program_id(0), tl.program_id(1)
    start = pid * chunk
    end = tl.minimum(start + chunk, N)
    best_v = -float("inf")
    best_i = tl.minimum(start, N - 1)      # a chunk of -inf only: its first index
    for k0 in tl.range(start, end, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + row.to(tl.int64) * sx + k, mask=k < end,
                    other=-float("inf")).to(tl.float32)
        m = tl.max(v, 0)
        i = tl.min(tl.where(v == m, k, N), 0)    # the lowest index holding the block's max
        take = m > best_v                        # strictly: an earlier block keeps a tie
        best_i = tl.where(take, i, best_i)
        best_v = tl.where(take, m, best_v)
    tl.store(part_v_ptr + row * PROGRAMS + pid, best_v)
    tl.store(part_i_ptr + row * PROGRAMS + pid, best_i)
    if arrival.arrive_last(count_ptr + row, tl.num_programs(0)):
        p = tl.arange(0, PROGRAMS)
        live = p < tl.num_programs(0)
        pv = tl.load(part_v_ptr + row * PROGRAMS + p, mask=live, other=-float("inf"),
                     cache_modifier=".cg")
        pi = tl.load(part_i_ptr + row * PROGRAMS + p, mask=live, other=N, cache_modifier=".cg")
        m = tl.max(pv, 0)
        idx = tl.min(tl.where(pv == m, pi, N), 0)   # chunks run in index order: lowest wins
        if HAS_MAP:
            idx = tl.load(map_ptr + idx)
        tl.store(out_ptr + row, idx.to(tl.int64))


def row_argmax(x: torch.Tensor, id_map: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Per row of ``x`` [M, N] float32, bfloat16 or float16 (rows contiguous, no NaN), the index of its largest
    value, ties to the lowest: ``torch.argmax(x, -1)`` [M] int64; with ``id_map`` [N] int64,
    ``id_map[argmax]``. ``out``: an [M] int64 tensor to write instead of a new one. Off CUDA
    (and under no Triton) the PyTorch ops. Raises ``ValueError`` for another dtype or shape,
    or more rows than the arrival counters hold."""
    if x.dim() != 2 or x.dtype not in _FLOATS or x.stride(-1) != 1 or x.shape[1] == 0:
        raise ValueError(f"row_argmax: needs [M, N > 0] float rows, contiguous along N; got "
                         f"{tuple(x.shape)} {x.dtype} strides {x.stride()}")
    M, N = x.shape
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
    return out


def _on_triton(x: torch.Tensor) -> bool:
    from mtpserve.kernels.dispatch import INTERPRET, use_triton

    return use_triton(x) or INTERPRET
