"""Checks of kernels/argmax_triton.py's ``row_argmax`` against ``torch.argmax``, shared by the
CPU run under Triton's interpreter (tests/test_argmax_kernel.py) and the GPU tests."""

from __future__ import annotations

import torch

from mtpserve.kernels.argmax_triton import row_argmax


def cases(device: str):
    """(name, x [M, N] float32) rows that test ties, chunk edges and -inf."""
    g = torch.Generator().manual_seed(0)
    out = []
    for M, N in ((1, 1), (1, 5), (2, 1024), (1, 1025), (3, 3000), (1, 32768), (4, 70001)):
        out.append((f"randn {M}x{N}", torch.randn(M, N, generator=g)))
        # few distinct values: ties everywhere, the lowest index must win
        out.append((f"ties {M}x{N}", torch.randint(0, 3, (M, N), generator=g).float()))
    late = torch.full((2, 70001), -5.0)
    late[0, 70000] = 1.0                    # the max in the last chunk's last value
    late[1, [1024, 40000]] = 2.0            # a tie across chunks
    out.append(("chunk edges", late))
    inf = torch.full((3, 5000), float("-inf"))
    inf[1, 4321] = -1e30
    inf[2, 3000:] = 7.0
    out.append(("-inf rows", inf))
    nan = torch.randn(3, 9000, generator=g)
    nan[0, 5000] = float("nan")             # a NaN beats every number, +inf included
    nan[1, [100, 8000]] = float("inf")
    nan[1, 7000] = float("nan")
    nan[2, [3, 8999]] = float("nan")        # the first NaN wins
    out.append(("NaN rows", nan))
    wide = torch.randn(3, 157000, generator=g)
    wide[1, 5000 + 151935] = 9.0             # the last value of row 1's slice
    out.append(("row slices, stride != N", wide[:, 5000:5000 + 151936]))
    out.append(("bfloat16 ties", torch.randint(0, 4, (2, 5000), generator=g).bfloat16()))
    return [(n, x.to(device)) for n, x in out]


def check(device: str) -> dict[str, int]:
    """Per case: rows where ``row_argmax`` differs from ``torch.argmax`` (and, with an id map,
    from ``map[torch.argmax]``); an ``out`` tensor must be written in place."""
    bad = {}
    for name, x in cases(device):
        ref = torch.argmax(x, -1)
        got = row_argmax(x)
        perm = torch.randperm(2 * x.shape[1], generator=torch.Generator().manual_seed(1))
        id_map = perm[::2].to(device)            # a strided map; an int32 one below
        out = torch.full((x.shape[0],), -1, dtype=torch.int64, device=device)
        mapped = row_argmax(x, id_map, out=out)
        mapped32 = row_argmax(x, id_map.to(torch.int32))
        bad[name] = (int((got != ref).sum()) + int((mapped != id_map[ref]).sum())
                     + int((mapped32 != id_map[ref]).sum()) + int(mapped32.dtype != torch.int64)
                     + int(mapped.data_ptr() != out.data_ptr()) + int(got.dtype != torch.int64))
    return bad
