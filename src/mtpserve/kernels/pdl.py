"""Programmatic dependent launch (PDL, CUDA compute capability 9.0+) for our Triton kernels.

A decode step at batch 1 is ~10 short kernels per layer, and each one's launch and ramp-up sit
between the previous kernel's last store and its own first load. Launched with PDL, a kernel's
programs may start while the previous kernel is still running: each of our kernels first waits
until the previous kernel has finished and its stores are visible (``griddepcontrol.wait``),
before it reads anything that kernel may write, or writes anything, and then lets the next
kernel launch (``griddepcontrol.launch_dependents``), whose programs get ready while this one
works.
Measured and dropped: an L2 prefetch of the weights before the wait, a bulk L2 prefetch of the
next product's weight issued by the short kernel before it or from extra programs during
attention, and loading each product program's first pipelined weight tile before the wait
(BENCHMARKS.md, sessions 5, 18, 19, 22). What paid: a one-row product whose tiles are one wave
loads its whole tile before the wait (kernels/gemv_triton.py, ``PRELOAD``), and a larger one runs
as one wave that loads its first unit before the wait and streams the rest, taking the norm or
activation before it into its own programs (kernels/gemv_stream_triton.py, session 23), and the
paged attention loads its first tile of keys and values before the wait (session 24;
kernels/paged_attention_triton.py, ``EARLY_KV``), and products of 2-8 rows stream their weight
through a shared-memory ring whose first units are asked for before the wait (session 28,
kernels/gemv_tc_gluon.py); the q/k norm + RoPE kernel loading its
positions, weights and cos / sin rows there gained nothing (session 24). A PDL boundary
(~0.9 us on the H200) is also cheaper than any signal through memory inside one persistent
kernel (benchmarks/gpu_boundary.py, session 22). Letting the
next kernel launch before this one's wait (session 17) or only after a product's loads (session
21) was slower too. Kernels not
launched with PDL (cuBLAS, PyTorch) keep the usual stream order, and the wait returns at once
after them. CUDA graphs keep these edges when a step is captured.
See the CUDA programming guide, "Programmatic Dependent Launch and Synchronization".
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# off: every kernel launches in plain stream order (benchmarks/gpu_decode.py --pdl-compare)
ENABLED = True


@functools.cache
def supported(index: int) -> bool:
    """Whether CUDA device ``index`` is Hopper (compute capability 9.0) or newer."""
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(x: torch.Tensor) -> bool:
    """Whether kernels working on ``x`` launch with PDL: CUDA, Hopper or newer, ENABLED."""
    return ENABLED and x.is_cuda and supported(x.device.index or 0)


def launch(x: torch.Tensor) -> dict:
    """Keyword arguments for a Triton launch over ``x``: the kernel's ``PDL`` constexpr and
    Triton's ``launch_pdl`` option, both ``enabled(x)``."""
    on = enabled(x)
    return {"PDL": on, "launch_pdl": on}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernel, then let the next one launch (no-op when PDL is off, and
    under Triton's CPU interpreter, where PDL is always off)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
