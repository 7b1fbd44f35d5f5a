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
    (one program per (token, KV head) merging itself, two, one per partition) and for a token
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


def check_qk_in_attention(device: str) -> int:
    """``paged_attention_triton(qk=QKRope(...))`` (one token: the partial kernel does the q/k
    norms, RoPE and K/V cache write itself) against ``qk_norm_rope_kv_write`` then the attention:
    the same output and KV caches bit for bit, with and without q/k norms, for a context of one
    live partition and of several, with grids of 1 (self-merging) and 3 programs per KV head.
    CPU: float32, Hq 4, Hkv 2, D 32, blocks of 8, partitions of 16 keys; CUDA: bfloat16, Hq 16,
    Hkv 8, D 128 (the 1.7B), blocks of 16, partitions of 64 keys. Returns the cases compared."""
    from fused_kernel_check import rope_tables

    from mtpserve.kernels.fused_triton import QKRope, qk_norm_rope_kv_write
    from mtpserve.kernels.paged_attention_triton import paged_attention_triton

    cpu = device == "cpu"
    dtype = torch.float32 if cpu else torch.bfloat16
    hq, hkv, d, block, part = (4, 2, 32, 8, 16) if cpu else (16, 8, 128, 16, 64)
    width = 8
    g = torch.Generator().manual_seed(11)
    cos, ssin = rope_tables(d)
    tables = torch.randperm(width, generator=g).to(device, torch.int32).view(1, width)
    row = torch.zeros(1, dtype=torch.int32, device=device)
    cases = 0
    for n in (5, width * block - 3):   # one live partition; several
        pos = torch.tensor([n - 1], device=device)
        slot = (tables[0, (n - 1) // block].long() * block + (n - 1) % block).view(1)
        qkv = torch.randn(1, (hq + 2 * hkv) * d, generator=g).to(device, dtype)
        caches = [torch.randn(width * block, hkv, d, generator=g).to(device, dtype)
                  for _ in range(2)]
        for norm in (False, True):
            w = dict(q_weight=(torch.rand(d, generator=g) + 0.5).to(device, dtype),
                     k_weight=(torch.rand(d, generator=g) + 0.5).to(device, dtype)) if norm else {}
            for grid in (1, 3):
                kc, vc = (c.clone() for c in caches)
                q = qk_norm_rope_kv_write(qkv, hq, hkv, d, pos, cos.to(device),
                                          ssin.to(device), kc, vc, slot, **w)
                lens = torch.tensor([n], dtype=torch.int32, device=device)
                want = paged_attention_triton(q, kc, vc, tables, row, lens, d ** -0.5, block,
                                              part, grid_parts=grid)
                kc2, vc2 = (c.clone() for c in caches)
                qk = QKRope(qkv, pos, cos.to(device), ssin.to(device), slot, **w)
                got = paged_attention_triton(torch.empty_like(q), kc2, vc2, tables, row, lens,
                                             d ** -0.5, block, part, grid_parts=grid, qk=qk)
                assert torch.equal(got, want), (n, norm, grid)
                assert torch.equal(kc2, kc) and torch.equal(vc2, vc), (n, norm, grid)
                cases += 1
    return cases
