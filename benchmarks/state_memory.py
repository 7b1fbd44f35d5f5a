"""Memory a Qwen3-Next-80B-A3B-shaped model needs per request, computed (nothing allocated).

Shape (DESIGN.md, Qwen3-Next-80B-A3B config): 48 layers, full attention every 4th (12 attention,
36 Gated DeltaNet), 2 KV heads x 256 head_dim, GDN 16 key heads / 32 value heads x 128, conv
kernel 4; KV cache and conv state in bfloat16, SSM state in float32.

    python benchmarks/state_memory.py [--k 3]
"""

from __future__ import annotations

import argparse

import torch

from mtpserve.engine.kv_cache import KVCache
from mtpserve.engine.state_cache import LinearAttnShape, StateCache

LAYERS, INTERVAL = 48, 4
GDN = LinearAttnShape(conv_dim=2 * 16 * 128 + 32 * 128, kernel=4, num_v_heads=32,
                      head_k_dim=128, head_v_dim=128)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=3, help="draft tokens per step")
    a = ap.parse_args()
    n_attn = LAYERS // INTERVAL
    n_gdn = LAYERS - n_attn
    state = StateCache.bytes_per_slot(n_gdn, GDN, torch.bfloat16, torch.float32)
    kv_token = KVCache.bytes_per_block(n_attn, 1, 2, 256, torch.bfloat16)
    mib = 2 ** 20
    print(f"{n_gdn} Gated DeltaNet layers, {n_attn} attention layers")
    print(f"recurrent state per request: {state / mib:.1f} MiB ({state} bytes)")
    print(f"  conv: {n_gdn * GDN.conv_dim * (GDN.kernel - 1) * 2 / mib:.2f} MiB, "
          f"SSM: {n_gdn * GDN.num_v_heads * GDN.head_k_dim * GDN.head_v_dim * 4 / mib:.1f} MiB")
    print(f"verify scratch per request drafting k={a.k}: {(a.k + 1) * state / mib:.1f} MiB")
    print(f"KV cache per token: {kv_token / 1024:.1f} KiB; a 32k-token context: "
          f"{32768 * kv_token / mib:.0f} MiB")


if __name__ == "__main__":
    main()
