"""GGUF tensor names -> HF parameter names, and the undoing of llama.cpp's q/k row permutation."""

from __future__ import annotations

import re

import torch

# Whole-model tensors (llama.cpp name -> HF name).
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

# Per-block tensors: blk.N.<key> -> model.layers.N.<value>.
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# Tensors with no HF parameter. rope_freqs holds llama3-style per-frequency rope divisors; HF
# computes those from config fields that the GGUF metadata does not carry, so they are dropped (with
# a warning from the loader: such a model runs with plain rope until this is implemented).
SKIPPED_TENSORS = frozenset({"rope_freqs.weight"})

_BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")
_GLOBAL_RE = re.compile(r"([a-z_]+)\.(weight|bias)")


def hf_name(gguf_name: str) -> str:
    """HF parameter name of a GGUF tensor.

    E.g. ``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``,
    ``token_embd.weight`` -> ``model.embed_tokens.weight``, ``output.weight`` -> ``lm_head.weight``.

    Raises:
        ValueError: for a name outside the llama / qwen2 / qwen3 tensor set.
    """
    m = _BLOCK_RE.fullmatch(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    m = _GLOBAL_RE.fullmatch(gguf_name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    raise ValueError(f"unknown GGUF tensor {gguf_name!r}: no HF parameter name for it")


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's row order of a llama q or k projection.

    ``w``: weight ``[n_heads*hd, in]`` or bias ``[n_heads*hd]``, any dtype.

    HF's llama rotates pairs (i, i + hd/2) of each head (``rotate_half``); ggml's rope rotates adjacent
    pairs (2i, 2i + 1). So the converter stores, inside each head, HF row ``a*hd/2 + i`` (a in {0, 1},
    i < hd/2) at row ``2i + a``: GGUF rows indexed (head, i, a) hold HF rows indexed (head, a, i). The
    inverse therefore views the rows as ``[n_heads, hd/2, 2]`` and swaps the last two row axes.
    Returns a new contiguous tensor of the same shape and dtype. Pure reordering: values are exact.

    Raises:
        ValueError: when the row count is not a multiple of ``2 * n_heads``.
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"cannot unpermute {rows} rows into {n_heads} heads of even size")
    half = rows // n_heads // 2
    rest = tuple(w.shape[1:])
    return w.reshape(n_heads, half, 2, *rest).transpose(1, 2).reshape(w.shape).contiguous()


def permute_heads(gguf_name: str, arch: str, n_heads: int, n_kv_heads: int) -> int | None:
    """Head count to unpermute ``gguf_name`` with, or None when its rows are stored in HF order.

    Only the llama architecture is permuted by llama.cpp's converter (its q with the query head
    count, its k with the key/value head count); qwen2 / qwen3 keep HF's order.
    """
    if arch != "llama":
        return None
    if ".attn_q." in gguf_name:
        return n_heads
    if ".attn_k." in gguf_name:
        return n_kv_heads
    return None
