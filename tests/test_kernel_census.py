"""The kernels of a hybrid decode and verify forward on the CUDA path (benchmarks/
cpu_kernel_census.py: Triton's interpreter, every layer's dispatch on its Triton path): between
the products, only Triton kernels. A PyTorch op that slips into a layer (a copy of a strided
view, a cat, an elementwise op) is a kernel boundary of its own in every step's CUDA graph;
this names it. Session 33 removed 78 such kernels a forward of the qwen3-next-3b structure."""

from __future__ import annotations

import json
import os

from interpreted import run_interpreted

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")

_CODE = f"""
import json, sys
sys.path.insert(0, {BENCH!r})
import cpu_kernel_census as c
out = {{step: [[k, n, line, cnt] for (k, n, line), cnt in counts.items()]
       for step, counts in c.census_of("tiny-qwen3-next", 3).items()}}
print("RESULT", json.dumps(out))
"""

# PyTorch ops that stay: products (cuBLAS or our Triton products on CUDA; PyTorch's on the
# CPU), the embedding lookup, the gather of the logits rows; CPU-only: the reference attention
# (CUDA runs the Triton paged attention) and the float32 cast of the CPU LM head's output
ALLOWED = {"linear", "mm", "addmm", "embedding"}
ALLOWED_LINES = ("kernels/paged_attention.py:", "engine/model_runner.py:", "layers/embedding.py:")

# 4 layers (3 Gated DeltaNet, 1 gated attention), each with a sparse MoE block whose shared
# expert is as wide as an expert: folded, it runs inside the experts' kernels (no SiLU-and-mul
# or products of its own), and the next norm sums each token's choices (no combine kernel); the
# embedding rows are read and normed for the first layer in one kernel
TRITON = {"_add_rms_norm_kernel": 8, "_embed_rms_norm_kernel": 1, "_conv_kernel": 3,
          "_recurrent_kernel": 3, "_gated_rms_norm_kernel": 3, "_qk_norm_rope_kv_kernel": 1,
          "_output_gate_kernel": 1, "_route_kernel": 4, "_gate_up_kernel": 4, "_down_kernel": 4}
# the products: in_proj and out_proj (Gated DeltaNet), qkv and o (attention), the router with
# the shared expert's gate (every layer), the LM head
PRODUCTS = 3 * 2 + 2 + 4 + 1


def test_hybrid_forward_launches_only_triton_kernels_between_products():
    census = json.loads(run_interpreted(_CODE, timeout=300))
    assert set(census) == {"decode", "verify"}
    for step, rows in census.items():
        stray = [r for r in rows if r[0] == "torch" and r[1] not in ALLOWED
                 and not r[2].startswith(ALLOWED_LINES)]
        assert stray == [], (step, stray)
        triton = {}
        for kind, name, _, n in rows:
            if kind == "triton":
                triton[name] = triton.get(name, 0) + n
        assert triton == TRITON, (step, triton)
        assert sum(n for kind, name, _, n in rows if name in ("linear", "mm", "addmm")) == PRODUCTS
