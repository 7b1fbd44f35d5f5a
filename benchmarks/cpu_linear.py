"""Float32 CPU matmul cost by row count: plain ``F.linear`` vs MKL-prepacked weights.

40 weights of [3072, 576] (SmolLM2's gate/up shape, 280 MB: more than the caches) are applied
in turn; the time is per pass over all 40.

    python benchmarks/cpu_linear.py
"""

import time

import torch
import torch.nn.functional as F

from mtpserve.kernels import cpu_linear


def timed(fn, n=10):
    for _ in range(3):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def main():
    ws = [torch.randn(3072, 576) for _ in range(40)]
    packed = [cpu_linear.pack(w) for w in ws] if cpu_linear.packing_available() else None
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'rows':>5}{'plain ms':>10}{'packed ms':>11}")
    for m in (1, 2, 4, 8, 16):
        x = torch.randn(m, 576)
        plain = timed(lambda: [F.linear(x, w) for w in ws])
        pk = timed(lambda: [cpu_linear.linear(x, w, None, p) for w, p in zip(ws, packed)]) \
            if packed else float("nan")
        print(f"{m:5d}{plain:10.2f}{pk:11.2f}")


if __name__ == "__main__":
    main()
