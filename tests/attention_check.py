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
    to 300), at two partition sizes: within 1e-5 (float32) or 1e-2 (bfloat16) of float64; the
    same bits on a repeat (after a call that left other partials behind), with every grid
    (one program per (token, KV head): the pair kernel; two; one per partition) and for a token
    alone as in its batch."""
    from mtpserve.kernels.paged_attention import build_torch_metadata, paged_attention_ref
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

    def attend(q, rows, kv_len, part, grid=None):
        return paged_attention_triton(q, k, v, tables, rows, kv_len, d ** -0.5, bs, part, grid)

    worst = {}
    for part in (64, 256):
        attend(-q, rows, kv_len, part, 1)   # leaves other partials behind in fresh scratch
        out = attend(q, rows, kv_len, part)
        worst[part] = ((out.double() - ref).norm() / ref.norm()).item()
        assert worst[part] < tol, (part, worst[part])
        parts = -(-tables.shape[1] * bs // part)
        for grid in (None, 1, 2, parts):
            assert torch.equal(attend(q, rows, kv_len, part, grid), out), (part, grid)
        for grid in (1, parts):   # a token alone: the bits it gets in the batch
            assert torch.equal(attend(q[5:6], rows[5:6], kv_len[5:6], part, grid), out[5:6])
    return worst


def check_early_kv(device: str, hq: int, hkv: int, d: int, dtype: str) -> int:
    """``paged_attention_triton.EARLY_KV``: the first tile of keys and values loaded before the
    PDL wait, the last T positions of each context (this step's own K/V) again after it. With
    the early loads reading a copy of the caches whose step positions (the last ``qlens`` of
    each sequence) hold other values, the output is bit-equal to EARLY_KV off, for the grids
    that run partitions in parallel (two, one per partition, the default); the copy changed at
    an older position changes the output (the early loads are the ones used). Returns the
    number of cases compared."""
    from mtpserve.kernels import paged_attention_triton as pa

    dt = getattr(torch, dtype)
    bs = 16
    qlens, slens = [1, 4, 1, 3], [70, 300, 17, 33]
    blocks = sum(-(-s // bs) for s in slens) + 4
    q, k, v, tables, rows, kv_len = _case(device, hq, hkv, d, dt, qlens, slens, bs, blocks, 7)
    stale_k, stale_v = k.clone(), v.clone()
    for b, (ql, s) in enumerate(zip(qlens, slens)):
        pos = torch.arange(s - ql, s, device=device)
        slots = tables[b, pos // bs].long() * bs + pos % bs
        stale_k[slots] = 1e3
        stale_v[slots] = -1e3

    def attend(part, grid, early, caches=(stale_k, stale_v)):
        pa.EARLY_KV = early
        return pa.paged_attention_triton(q, k, v, tables, rows, kv_len, d ** -0.5, bs, part,
                                         grid, early_kv=caches if early else None)

    cases = 0
    saved = pa.EARLY_KV
    try:
        for part in (64, 256):
            parts = -(-tables.shape[1] * bs // part)
            for grid in (None, 2, parts):
                assert torch.equal(attend(part, grid, True), attend(part, grid, False))
                cases += 1
        older = stale_k.clone()
        older[tables[1, 0].long() * bs] += 1.0   # position 0 of sequence 1, read early
        assert not torch.equal(attend(64, 2, True, (older, stale_v)), attend(64, 2, False))
    finally:
        pa.EARLY_KV = saved
    return cases
