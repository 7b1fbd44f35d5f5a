"""Checks of the Triton paged attention (kernels/paged_attention_triton.py) against the
float64 PyTorch reference, for any device: ``"cuda"`` (tests/test_gpu.py) or ``"cpu"`` under
Triton's interpreter (tests/test_attention_kernel.py runs it in a subprocess, float32)::

    TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'tests'); \\
        import attention_check as a; a.check_paged_attention('cpu', 4, 2, 32, 'float32')"

Raises AssertionError on a mismatch; returns the worst relative error per partition size.
"""

from __future__ import annotations

import torch


def _case(device, hq, hkv, d, dtype, qlens, slens, bs, blocks, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(blocks * bs, hkv, d, generator=g).to(device, dtype)
    v = torch.randn(blocks * bs, hkv, d, generator=g).to(device, dtype)
    perm = torch.randperm(blocks, generator=g).to(torch.int32)
    width = max(-(-s // bs) for s in slens)
    tables = torch.zeros(len(slens), width, dtype=torch.int32)
    used = 0
    for b, s in enumerate(slens):
        n = -(-s // bs)
        tables[b, :n] = perm[used:used + n]
        used += n
    q = torch.randn(sum(qlens), hq, d, generator=g).to(device, dtype)
    rows = torch.repeat_interleave(torch.arange(len(qlens)), torch.tensor(qlens)).to(torch.int32)
    kv_len = torch.tensor([s - ql + i + 1 for s, ql in zip(slens, qlens) for i in range(ql)],
                          dtype=torch.int32)
    return q, k, v, tables.to(device), rows.to(device), kv_len.to(device)


def check_paged_attention(device: str, hq: int, hkv: int, d: int, dtype: str,
                          big: bool = False) -> dict:
    """Decode, verify and prefill-like tokens over contexts of 1 to 2100 keys (``big``; else 1
    to 300), at two partition sizes, with the merge inside the kernel and (counters
    exhausted) by the merge kernel: within 1e-5 (float32) or 1e-2 (bfloat16) of float64; the
    same bits on a repeat (after a call that left other partials behind); the two merges agree
    (bit for bit on the CPU); a token's output does not depend on the tokens beside it."""
    from mtpserve.kernels import arrival
    from mtpserve.kernels.paged_attention import build_torch_metadata, paged_attention_ref
    from mtpserve.kernels import paged_attention_triton as pat
    from mtpserve.kernels.paged_attention_triton import paged_attention_triton

    dt = getattr(torch, dtype)
    bs = 16
    qlens, slens = [1, 4, 1, 3, 9], ([1, 300, 1500, 17, 2100] if big else [1, 70, 300, 17, 33])
    blocks = sum(-(-s // bs) for s in slens) + 4
    q, k, v, tables, rows, kv_len = _case(device, hq, hkv, d, dt, qlens, slens, bs, blocks,
                                          hq * d)
    ref = paged_attention_ref(q.double(), k.double(), v.double(),
                              build_torch_metadata(qlens, slens, tables, bs, q.device,
                                                   torch.float64), d ** -0.5)
    tol = 1e-5 if dt == torch.float32 else 1e-2
    worst = {}
    saved_flag, pat.MERGE_IN_KERNEL = pat.MERGE_IN_KERNEL, True
    try:
        for part in (64, 256):
            worst[part] = _check_part(paged_attention_triton, arrival, q, k, v, tables, rows,
                                      kv_len, d, bs, part, ref, tol, device, dt)
    finally:
        pat.MERGE_IN_KERNEL = saved_flag
    assert int(arrival.counters(q.device).abs().sum()) == 0
    return worst


def _check_part(paged_attention_triton, arrival, q, k, v, tables, rows, kv_len, d, bs, part,
                ref, tol, device, dt) -> float:
    """One partition size: the in-kernel merge (after a call on other queries, so partials a
    too-early read would see differ) against the reference, a repeat, the merge kernel, and a
    token alone; returns the relative error against the reference."""
    # a call on other queries first, so partials a merge might read too early differ
    paged_attention_triton(-q, k, v, tables, rows, kv_len, d ** -0.5, bs, part)
    out = paged_attention_triton(q, k, v, tables, rows, kv_len, d ** -0.5, bs, part)
    worst = ((out.double() - ref).norm() / ref.norm()).item()
    assert worst < tol, (part, worst)
    again = paged_attention_triton(q, k, v, tables, rows, kv_len, d ** -0.5, bs, part)
    assert torch.equal(out, again), part
    saved = arrival.NUM_COUNTERS
    arrival.NUM_COUNTERS = 0          # forces the separate merge kernel
    try:
        two = paged_attention_triton(q, k, v, tables, rows, kv_len, d ** -0.5, bs, part)
    finally:
        arrival.NUM_COUNTERS = saved
    # the two compiled variants may round differently on CUDA (the same bits on the CPU)
    diff = ((out.double() - two.double()).norm() / two.double().norm()).item()
    assert diff <= (0.0 if device == "cpu" else 1e-6 if dt == torch.float32 else 2e-3), diff
    one = paged_attention_triton(q[5:6], k, v, tables, rows[5:6], kv_len[5:6], d ** -0.5,
                                 bs, part)
    assert torch.equal(one, out[5:6]), part
    return worst
