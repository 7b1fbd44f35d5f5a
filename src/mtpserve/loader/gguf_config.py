"""GGUF metadata -> transformers config (LlamaConfig / Qwen2Config / Qwen3Config), without AutoConfig."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# GGUF architecture -> name of its transformers config class, imported when a config is built:
# ``LlamaConfig`` alone pulls in transformers.activations and with it torch.distributed.tensor
# and sympy (0.55 s on a CPU dev box), which a qwen checkpoint never needs.
CONFIG_CLASSES: dict[str, str] = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
}
SUPPORTED_ARCHS = tuple(CONFIG_CLASSES)


def config_class(arch: str) -> type[PretrainedConfig]:
    """The transformers config class of a supported GGUF architecture (``KeyError`` otherwise),
    imported through ``configs.config_class`` (no GenerationMixin / torch._dynamo on
    transformers 5.17)."""
    from .configs import config_class as named_config_class

    return named_config_class(CONFIG_CLASSES[arch])
_ROPE_SCALING_TYPES = ("linear", "yarn")


def gguf_architecture(meta: Mapping[str, Any], path: str) -> str:
    """The ``general.architecture`` of a GGUF, checked against the supported ones.

    Raises:
        ValueError: for a missing or unsupported architecture (the message names ``path``).
    """
    arch = meta.get("general.architecture")
    if arch not in CONFIG_CLASSES:
        raise ValueError(f"{path}: unsupported GGUF architecture {arch!r}; supported: "
                         f"{', '.join(SUPPORTED_ARCHS)}")
    return arch


def _required(meta: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in meta:
        raise ValueError(f"{path}: GGUF metadata lacks {key!r}")
    return meta[key]


def rope_parameters(meta: Mapping[str, Any], arch: str, path: str) -> dict[str, Any]:
    """HF ``rope_parameters`` from ``{arch}.rope.*`` (theta in the GGUF's units; default 10000).

    Linear and YaRN scaling carry over ``factor`` and ``original_max_position_embeddings``.

    Raises:
        ValueError: for another scaling type (e.g. longrope), which is not mapped.
    """
    params: dict[str, Any] = {"rope_type": "default",
                              "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0))}
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return params
    if kind not in _ROPE_SCALING_TYPES:
        raise ValueError(f"{path}: unsupported rope scaling type {kind!r}")
    params["rope_type"] = kind
    params["factor"] = float(_required(meta, f"{arch}.rope.scaling.factor", path))
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        params["original_max_position_embeddings"] = int(original)
    return params


def _head_dim(meta: Mapping[str, Any], arch: str, hidden: int, heads: int, path: str) -> int:
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    rot = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rot != head_dim:
        raise ValueError(f"{path}: partial rotary (rope dims {rot} < head_dim {head_dim}) unsupported")
    if arch == "qwen2" and head_dim * heads != hidden:
        raise ValueError(f"{path}: qwen2 needs head_dim * heads == hidden ({head_dim}*{heads}!={hidden})")
    return head_dim


def config_from_gguf(meta: Mapping[str, Any], tensor_names: set[str], vocab_size: int,
                     path: str) -> PretrainedConfig:
    """Build the transformers config of a llama / qwen2 / qwen3 GGUF from its metadata.

    ``meta`` maps GGUF keys to scalars (``llama.block_count`` ...); ``tensor_names`` are the GGUF
    tensor names (``output.weight`` absent means tied embeddings; ``blk.0.attn_q.bias`` present
    means attention biases); ``vocab_size`` is ``len(tokenizer.ggml.tokens)``.

    Raises:
        ValueError: unsupported architecture or rope, or a required size missing (names ``path``).
    """
    arch = gguf_architecture(meta, path)
    hidden = int(_required(meta, f"{arch}.embedding_length", path))
    heads = int(_required(meta, f"{arch}.attention.head_count", path))
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=int(_required(meta, f"{arch}.feed_forward_length", path)),
        num_hidden_layers=int(_required(meta, f"{arch}.block_count", path)),
        num_attention_heads=heads,
        num_key_value_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        rms_norm_eps=float(_required(meta, f"{arch}.attention.layer_norm_rms_epsilon", path)),
        max_position_embeddings=int(_required(meta, f"{arch}.context_length", path)),
        rope_parameters=rope_parameters(meta, arch, path),
        tie_word_embeddings="output.weight" not in tensor_names,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )
    head_dim = _head_dim(meta, arch, hidden, heads, path)
    if arch != "qwen2":
        kwargs["head_dim"] = head_dim
        kwargs["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    return config_class(arch)(**kwargs)
