"""A barrier across every program of one persistent Triton kernel (CUDA's grid-wide sync, as in
cooperative groups' ``grid.sync()``), so that one kernel can run two dependent phases: every
program finishes phase one, then any may read what the others wrote.

Two int32 counters per device, zero between kernels. :func:`grid_sync`: each program fences its
stores, adds one to the first counter and waits until it reads ``programs``. :func:`grid_leave`:
at the kernel's end each program adds one to the second counter, and the last to arrive puts
both back to zero (every program has passed the barrier by then), so a captured CUDA graph can
replay the kernel. The kernel that uses it must launch no more programs than the GPU holds at
once (a program spinning in the barrier keeps its SM slot): see kernels/mlp_triton.py.
Triton's CPU interpreter runs programs one after another, so a kernel there runs its phases as
two launches instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpserve.kernels.arrival import arrive_last, fence_gpu

_buffers: dict[torch.device, torch.Tensor] = {}


def counters(device: torch.device) -> torch.Tensor:
    """The zeroed [2] int32 barrier counters of ``device`` (made on first use)."""
    buf = _buffers.get(device)
    if buf is None:
        buf = _buffers[device] = torch.zeros(2, dtype=torch.int32, device=device)
    return buf


@triton.jit
def grid_sync(sync_ptr, programs):
    """Wait until all ``programs`` programs of the kernel have called this; the stores each made
    before are visible to every program after (read them past L1: ``cache_modifier=".cg"``)."""
    fence_gpu()
    tl.debug_barrier()   # every thread's stores are fenced before the program arrives
    seen = tl.atomic_add(sync_ptr, 1, sem="acq_rel", scope="gpu") + 1
    while seen < programs:
        seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    fence_gpu()
    tl.debug_barrier()


@triton.jit
def grid_leave(sync_ptr, programs):
    """Called once by each program after its last :func:`grid_sync`: the last of ``programs`` to
    leave puts the barrier's counter back to zero (``arrive_last`` resets its own)."""
    if arrive_last(sync_ptr + 1, programs):
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
