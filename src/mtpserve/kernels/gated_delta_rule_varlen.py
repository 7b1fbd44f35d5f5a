"""The chunked gated delta rule over every long sequence of a step at once (prefill chunks).

A prefill step of many requests runs the chunked form (kernels/gated_delta_rule.py
``chunk_gated_delta_rule``) once per sequence and layer: dozens of small PyTorch ops each time,
so a step of 64 prompts spends most of its time launching them (H200, hybrid MoE shape: prefill
steps of 64 x 128 tokens took 190-620 ms, BENCHMARKS.md session 11). flash-linear-attention's
``chunk_gated_delta_rule`` (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks"; fla-core on
PyPI) runs all sequences of a step in one varlen call (``cu_seqlens``, as FlashAttention's API).

Backends, chosen by the environment variable ``MTPSERVE_GDN_PREFILL``:
- ``torch`` (default): the reference, sequence by sequence (the layer then runs each sequence
  on its own, states in place: layers/linear_attention.py ``_run_chunked``);
- ``fla``: one fla call (CUDA, fla-core installed). Not yet the default: its numbers against the
  reference and its speed are to be measured on the H200 (tests/test_gpu.py), and so is the
  memory of its copies of every sequence's state, which the memory profile does not see.
"""

from __future__ import annotations

import itertools
import os

import torch

from mtpserve.engine.forward_batch import to_device
from mtpserve.kernels.gated_delta_rule import chunk_gated_delta_rule

BACKENDS = ("torch", "fla")


def backend() -> str:
    """The backend ``MTPSERVE_GDN_PREFILL`` names (default ``torch``).

    Raises:
        ValueError: an unknown name.
    """
    name = os.environ.get("MTPSERVE_GDN_PREFILL", "torch")
    if name not in BACKENDS:
        raise ValueError(f"MTPSERVE_GDN_PREFILL must be one of {BACKENDS}, got {name!r}")
    return name


def fla_chunk():
    """flash-linear-attention's ``chunk_gated_delta_rule``.

    Raises:
        ImportError: fla-core is not installed.
    """
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk_gdr

    return fla_chunk_gdr


def chunk_varlen(q, k, v, g, beta, states, lengths: list[int], name: str | None = None):
    """The gated delta rule over N sequences laid back to back.

    Args:
        q, k: [T, Hk, Dk] (any float dtype); v: [T, Hv, Dv], Hv a multiple of Hk (value head h
            reads key head h // (Hv / Hk)); g (log decay), beta: [T, Hv] float32;
        states: [N, Hv, Dk, Dv] float32, each sequence's initial state;
        lengths: N token counts summing to T;
        name: the backend (None: :func:`backend`).

    Returns:
        (out [T, Hv, Dv] float32, final states [N, Hv, Dk, Dv] float32): per sequence what
        ``chunk_gated_delta_rule`` returns (L2-normalised q and k, q scaled by Dk ** -0.5).
    """
    if (name or backend()) == "fla":
        return _fla(q, k, v, g, beta, states, lengths)
    outs, finals, start = [], [], 0
    for length, state in zip(lengths, states):
        end = start + length
        o, final = chunk_gated_delta_rule(q[start:end], k[start:end], v[start:end],
                                          g[start:end], beta[start:end], state)
        outs.append(o)
        finals.append(final)
        start = end
    return torch.cat(outs), torch.stack(finals)


def _fla(q, k, v, g, beta, states, lengths):
    """One fla call: key heads repeated for their value heads (so fla's own GVA mapping does
    not matter), L2 norm of q and k in the kernel, its default scale Dk ** -0.5."""
    rep = v.shape[-2] // k.shape[-2]
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=-2), k.repeat_interleave(rep, dim=-2)
    dtype = v.dtype
    cu = to_device(list(itertools.accumulate(lengths, initial=0)), torch.int64, q.device)
    out, final = fla_chunk()(
        q.to(dtype).contiguous()[None], k.to(dtype).contiguous()[None], v.contiguous()[None],
        g.float().contiguous()[None], beta.to(dtype).contiguous()[None],
        initial_state=states.float().contiguous(), output_final_state=True,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    return out[0].float(), final.float()
