"""Tokenizers: HF tokenizer directories, and GGUF-embedded tokenizers with their chat template."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # transformers (and gguf, for GGUF files) are imported when a tokenizer loads
    from transformers import PreTrainedTokenizerBase

# Any of these marks a directory as holding a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

# ``tokenizer_class`` values naming transformers' plain tokenizers-library class (the second is an
# alias of the first in transformers 5).
BACKEND_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# Model types for which AutoTokenizer (5.17 and 5.24 read) keeps a ``BACKEND_CLASSES`` named in
# tokenizer_config.json: none is in its MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS (qwen2 and, in
# 5.24, qwen3_5 / qwen3_5_moe are: AutoTokenizer gives them their own class) and none registers
# MistralCommonBackend. tests/test_configs.py checks both against the installed transformers.
BACKEND_MODEL_TYPES = frozenset({"llama", "qwen3", "qwen3_moe", "qwen3_next"})


def has_tokenizer_files(folder: str) -> bool:
    """True when ``folder`` holds at least one of ``TOKENIZER_FILES``."""
    return any(os.path.isfile(os.path.join(folder, n)) for n in TOKENIZER_FILES)


def apply_gguf_metadata(tok: PreTrainedTokenizerBase, meta: Mapping[str, Any]) -> None:
    """Make ``tok`` agree with the GGUF: chat template from ``tokenizer.chat_template``, and the
    eos / bos tokens from ``tokenizer.ggml.eos_token_id`` / ``bos_token_id`` (ids into the vocab)."""
    template = meta.get("tokenizer.chat_template")
    if template and not tok.chat_template:
        tok.chat_template = template
    for role in ("eos", "bos"):
        want = meta.get(f"tokenizer.ggml.{role}_token_id")
        if want is not None and getattr(tok, f"{role}_token_id") != want:
            setattr(tok, f"{role}_token", tok.convert_ids_to_tokens(int(want)))


def tokenizer_from_gguf(path: str, meta: Mapping[str, Any]) -> PreTrainedTokenizerBase:
    """The fast tokenizer that transformers builds from a GGUF's vocab and merges (~7 s for SmolLM2),
    with ``apply_gguf_metadata`` applied. ``meta`` is the file's ``gguf_metadata``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path))
    apply_gguf_metadata(tok, meta)
    return tok


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def loads_as_backend(folder: str) -> bool:
    """True when ``AutoTokenizer.from_pretrained(folder)`` would return
    ``TokenizersBackend.from_pretrained(folder)``, known without importing AutoTokenizer: the
    folder has tokenizer.json, and tokenizer_config.json names one of ``BACKEND_CLASSES`` with no
    ``auto_map``, and config.json is absent or names one of ``BACKEND_MODEL_TYPES`` with no
    ``auto_map``. Our own checkpoints (benchmarks' random ones, GGUF cache entries) are such folders.

    Why: transformers 5.17's ``tokenization_auto`` imports ``auto_factory``, which imports
    ``GenerationMixin`` and with it torch._dynamo (+ scikit-learn when installed) and sympy
    (see configs.py). Measured on the CPU dev box, the tokenizer of a qwen3 directory in a fresh
    interpreter that has torch and the config already: AutoTokenizer 1.3 s on 5.17 (1.9 s with
    scikit-learn installed), 0.2 s on 5.24; ``load_tokenizer`` 0.3 s on 5.17, 0.17 s on 5.24.
    """
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return False
    tok_config = _read_json(os.path.join(folder, "tokenizer_config.json"))
    if tok_config is None or tok_config.get("tokenizer_class") not in BACKEND_CLASSES \
            or "auto_map" in tok_config:
        return False
    config_path = os.path.join(folder, "config.json")
    if not os.path.exists(config_path):
        return True
    config = _read_json(config_path)
    return (config is not None and config.get("model_type") in BACKEND_MODEL_TYPES
            and "auto_map" not in config)


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """A tokenizer from an HF directory or from a ``.gguf`` file (not cached: slow for GGUF).

    A directory for which ``loads_as_backend`` holds is read by ``TokenizersBackend`` directly (the
    class AutoTokenizer picks there); any other goes through ``AutoTokenizer``.

    Raises:
        FileNotFoundError: when ``path`` does not exist or a directory holds no tokenizer files.
    """
    if os.path.isfile(path) and path.endswith(".gguf"):
        from .gguf_meta import gguf_metadata, open_gguf

        return tokenizer_from_gguf(path, gguf_metadata(open_gguf(path)))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer path {path!r} is neither a directory nor a .gguf file")
    if not has_tokenizer_files(path):
        raise FileNotFoundError(f"{path}: no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); "
                                f"pass a tokenizer path")
    if loads_as_backend(path):
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(path, _from_auto=True)  # as AutoTokenizer passes
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
