"""Split reductions finished inside one kernel: the last program of a group to arrive sums the
group's partial results (a "serial fix-up", as in the split-K and stream-K GEMMs of CUTLASS and
Osama et al. 2023), so no second kernel is launched for the reduction.

Each group owns one int32 counter in a per-device buffer that is all zeros between kernels: every
program of the group stores its partial result, then adds one to the counter; the program that
sees ``count - 1`` reads all partials in a fixed order (so the sum does not depend on which
program came last) and puts the counter back to zero. Kernels on one device run one after
another on the engine's stream, so one buffer serves them all.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels.dispatch import INTERPRET

# counters per device: a kernel may use up to this many groups
NUM_COUNTERS = 1 << 16
_buffers: dict[torch.device, torch.Tensor] = {}
# PTX fences need a GPU: Triton's CPU interpreter runs programs one after another anyway
_FENCE = tl.constexpr(not INTERPRET)


def counters(device: torch.device) -> torch.Tensor:
    """The zeroed [NUM_COUNTERS] int32 counter buffer of ``device`` (made on first use)."""
    buf = _buffers.get(device)
    if buf is None:
        buf = _buffers[device] = torch.zeros(NUM_COUNTERS, dtype=torch.int32, device=device)
    return buf


@triton.jit
def _fence_gpu():
    """``fence.acq_rel.gpu`` in every thread (CUDA's ``__threadfence``)."""
    if _FENCE:
        tl.inline_asm_elementwise("fence.acq_rel.gpu; // dummy $0", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def arrive_last(counter_ptr, count):
    """Signal that this program's partial result is stored; True in the last of ``count``
    programs to call it on ``counter_ptr``, which also resets the counter to zero.

    Every thread fences its own stores before the program signals (the pattern of CUDA's
    threadFenceReduction sample), and fences again once it knows it is last, before it reads
    the others' partials; the caller reads them with ``cache_modifier=".cg"`` (from L2)."""
    _fence_gpu()
    tl.debug_barrier()   # all threads' partial stores are fenced before the signal
    old = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = old == count - 1
    if last:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        _fence_gpu()
    tl.debug_barrier()
    return last
