"""One call of each fused product of 4 rows at the 1.7B gate/up shape (4 partials, then a tensor),
for ncu (benchmarks/gpu_session.sh rows_k)."""
import torch
from gpu_rows_input import inputs
from mtpserve.kernels.gemv_triton import gemv
w = torch.randn(12288, 2048, device="cuda", dtype=torch.bfloat16) * 0.02
for kind in ("norm4", "norm"):
    f, a, kw = inputs(kind, 4, 2048)
    for _ in range(3):
        gemv(f(), w, **kw)
torch.cuda.synchronize()
