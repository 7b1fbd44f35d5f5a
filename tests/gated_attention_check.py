"""Checks of gated attention's CUDA path (layers/gated_attention.py ``_fused_attend``: the q/k
norm + partial RoPE + K/V write kernel reading gated queries in place, and
kernels/output_gate_triton.py) against the unfused path it replaced (the q/k norm and RoPE
kernels, PyTorch's copy, sigmoid and product), for ``"cuda"`` (tests/test_gpu.py) or ``"cpu"``
under Triton's interpreter (tests/test_gated_attention_kernel.py).

Tolerances as tests/fused_kernel_check.py's: the fused norm sums its squares in another order,
so a bfloat16 value may flip by one ulp after a norm and the flips add up through RoPE and
attention (within 2^-5 of the largest magnitude, at most 1% of the values); float32 within 1e-5
of the largest magnitude; values (V) bit-exact. The output gate alone: bfloat16 within one ulp,
float32 within 2e-6 of each value (its exp and division round in another order than PyTorch's
sigmoid: ~3e-7 measured under the interpreter; the check allows 2e-6 for CUDA's approximate
exp).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from unittest import mock

import torch

from fused_kernel_check import (_gen, _record, interpreter_rounding, rel_to_max, ulp_distance)

BF16_REL, BF16_DIFFER, F32_REL = 2.0 ** -5, 0.01, 1e-5


def check_output_gate(device) -> dict:
    """``output_gate_`` against ``out * torch.sigmoid(gate)`` with the gate a strided view of a
    q/k/v-like row (each head's gate after its query), float32 and bfloat16."""
    from mtpserve.kernels.output_gate_triton import output_gate_

    worst = {}
    with interpreter_rounding(device):
        for dtype in (torch.float32, torch.bfloat16):
            g = _gen(11)
            T, Hq, D = 5, 3, 24
            qkv = (torch.randn(T, Hq * 2 * D + 8, generator=g) * 3).to(dtype)
            out = torch.randn(T, Hq * D, generator=g).to(dtype)
            gate = qkv[:, :Hq * 2 * D].view(T, Hq, 2 * D)[..., D:]
            ref = out * torch.sigmoid(gate).reshape(T, Hq * D)
            got = output_gate_(out.to(device), gate.to(device)).cpu()
            _record(worst, dtype, "output_gate", got, ref)
            if dtype == torch.float32:   # float32 exp / division in another order
                rel = float(((got - ref).abs() / ref.abs().clamp_min(1e-30)).max())
                assert rel <= 2e-6, rel   # CUDA's exp is approximate (ex2.approx)
            else:
                assert ulp_distance(got, ref) <= 1, ulp_distance(got, ref)
    return worst


def _layer():
    """A tiny Qwen3-Next gated attention layer (tests/harness_hybrid.py's SHAPE: 4 query and 2
    KV heads of 16, RoPE on 4 channels) with random weights, zero-centred norm weights, and
    o_proj the identity (its output is the gated attention output itself)."""
    from transformers import AutoConfig

    from harness_hybrid import SHAPE
    from mtpserve.config import ModelConfig
    from mtpserve.layers.gated_attention import GatedAttention, rotary_dim
    from mtpserve.layers.rotary import RotaryEmbedding

    hf = AutoConfig.for_model("qwen3_next", **SHAPE)
    cfg = ModelConfig.from_hf(hf)
    rope = RotaryEmbedding(cfg.head_dim, rotary_dim(cfg), 64, hf)
    assert rope.rotary_dim < cfg.head_dim   # partial RoPE
    layer = GatedAttention(cfg, rope, 0).eval()
    g = _gen(7)
    with torch.no_grad():
        layer.qkv_proj.weight.copy_(torch.randn(layer.qkv_proj.weight.shape, generator=g) * 0.3)
        for norm in (layer.q_norm, layer.k_norm):
            norm.weight.copy_(torch.randn(norm.weight.shape, generator=g) * 0.3)
        assert layer.o_proj.weight.shape[0] == layer.o_proj.weight.shape[1]
        layer.o_proj.weight.copy_(torch.eye(layer.o_proj.weight.shape[0]))
    return layer, cfg


def _steps(layer, cfg, x, device, fused: bool):
    """A 5-token prefill (positions 0-4) then one decode token (5), slot = position + 2 in one
    KV cache, through the layer's CUDA path (``fused``) or the path it replaced: the q/k norms
    and RoPE as the unfused Triton kernels, ``Attention.forward`` writing K/V, the gate in
    PyTorch; attention as ``device`` runs it in both. Returns (outputs [6, H], K, V caches)."""
    from mtpserve.kernels.paged_attention import TritonAttentionMetadata, build_torch_metadata
    from mtpserve.layers import gated_attention, norm, rotary

    dtype, bs = x.dtype, 4
    kv = [(torch.zeros(12, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype, device=device),
           torch.zeros(12, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype, device=device))]
    tables = torch.arange(3, dtype=torch.int32, device=device).unsqueeze(0)
    outs = []
    with mock.patch.object(gated_attention, "use_triton", lambda t: fused), \
            mock.patch.object(rotary, "use_triton", lambda t: True), \
            mock.patch.object(norm, "use_triton", lambda t: True):
        for start, stop in ((0, 5), (5, 6)):
            pos = torch.arange(start, stop, device=device)
            if stop - start == 1:
                attn = TritonAttentionMetadata(torch.zeros(1, dtype=torch.int32, device=device),
                                               torch.tensor([stop + 2], dtype=torch.int32,
                                                            device=device), tables, bs, 64)
            else:
                attn = build_torch_metadata([stop - start], [stop + 2], tables, bs,
                                            torch.device(device), dtype)
            batch = SimpleNamespace(slot_mapping=pos + 2, attn=attn, kv_caches=kv)
            outs.append(layer(layer.rotary.lookup(pos, dtype), x[start:stop], batch))
    return torch.cat(outs).cpu(), kv[0][0].cpu(), kv[0][1].cpu()


def check_gated_attention(device) -> dict:
    """The layer's CUDA path against the unfused path it replaced, both on ``device``, float32
    and bfloat16: outputs, keys (normed, rotated) and values in the cache."""
    base, cfg = _layer()
    worst = {}
    with interpreter_rounding(device), torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            layer = copy.deepcopy(base).to(dtype)
            # slots 0-1 stay zero and are attended as context in both paths (kv_len = pos + 3)
            x = torch.randn(6, cfg.hidden_size, generator=_gen(3)).to(dtype)
            layer, x = layer.to(device), x.to(device)
            ref = _steps(layer, cfg, x, device, fused=False)
            got = _steps(layer, cfg, x, device, fused=True)
            for name, a, b in zip(("out", "k_cache", "v_cache"), got, ref):
                _record(worst, dtype, f"gated_attention_{name}", a, b)
            assert torch.equal(got[2], ref[2]), "values differ (a plain copy)"
            for a, b in zip(got[:2], ref[:2]):
                if dtype == torch.float32:
                    assert rel_to_max(a, b) <= F32_REL, rel_to_max(a, b)
                else:
                    differ = (a != b).float().mean().item()
                    assert rel_to_max(a, b) <= BF16_REL and differ <= BF16_DIFFER, \
                        (rel_to_max(a, b), differ)
    return worst
