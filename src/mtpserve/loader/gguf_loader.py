"""Load a GGUF checkpoint through the conversion cache (see cache.py).

A load from a complete cache entry reads config.json, the saved tokenizer and the safetensors
header only, so gguf (and the GGUF parsing modules) are imported only when a file is converted.
"""

from __future__ import annotations

import functools
import logging
import os

from .cache import build_entry, entry_dir, is_complete, source_key
from .configs import load_config
from .model_files import ModelFiles
from .tokenizer import load_tokenizer, tokenizer_from_gguf

log = logging.getLogger(__name__)
WEIGHTS = "model.safetensors"


def _from_cache(path: str, entry: str, tokenizer: str | None) -> ModelFiles | None:
    """The ModelFiles of a complete cache entry, or None (logged) when any part fails to read."""
    from safetensors import safe_open

    weights = os.path.join(entry, WEIGHTS)
    try:
        config = load_config(entry)
        config.name_or_path = path  # as on a fresh conversion, not the cache directory
        tok = load_tokenizer(entry) if tokenizer is None else None
        with safe_open(weights, framework="pt", device="cpu") as f:
            f.keys()
    except Exception as e:  # noqa: BLE001 - any unreadable part means: rebuild the entry
        log.warning("ignoring unreadable cache entry %s (%s: %s)", entry, type(e).__name__, e)
        return None
    tok = tok if tok is not None else load_tokenizer(tokenizer)
    return ModelFiles(hf_config=config, tokenizer=tok, source=path, kind="gguf",
                      weight_files=(weights,), cache_dir=entry)


def _convert(path: str, key: dict, tokenizer: str | None) -> ModelFiles:
    """Read and convert the GGUF, write the cache entry, return ModelFiles reading from it.

    When the cache cannot be written (OSError), weights are dequantized from the GGUF on each
    ``iter_weights`` instead.
    """
    import torch

    from .gguf_config import config_from_gguf, gguf_architecture
    from .gguf_meta import gguf_metadata, open_gguf
    from .gguf_tensors import iter_planned, tensor_plan
    from .safetensors_writer import write_safetensors

    reader = open_gguf(path)
    meta = gguf_metadata(reader)
    arch = gguf_architecture(meta, path)
    vocab = meta.get("tokenizer.ggml.tokens.count") or meta.get(f"{arch}.vocab_size")
    if not vocab:
        raise ValueError(f"{path}: GGUF has no tokenizer.ggml.tokens (vocab size unknown)")
    config = config_from_gguf(meta, {t.name for t in reader.tensors}, int(vocab), path)
    config.name_or_path = path
    plan = tensor_plan(reader, arch, config.num_attention_heads, config.num_key_value_heads, path)
    tok = tokenizer_from_gguf(path, meta)
    user_tok = load_tokenizer(tokenizer) if tokenizer is not None else tok
    try:
        with build_entry(key) as tmp:
            config.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            specs = [(p.name, p.shape, torch.float32) for p in plan]
            write_safetensors(os.path.join(tmp, WEIGHTS), specs, iter_planned(plan))
    except OSError as e:
        log.warning("cannot write the GGUF cache (%s); dequantizing on every load", e)
        return ModelFiles(hf_config=config, tokenizer=user_tok, source=path, kind="gguf",
                          weight_stream=functools.partial(iter_planned, plan))
    entry = str(entry_dir(key))
    return ModelFiles(hf_config=config, tokenizer=user_tok, source=path, kind="gguf",
                      weight_files=(os.path.join(entry, WEIGHTS),), cache_dir=entry)


def load_gguf(path: str, tokenizer: str | None = None) -> ModelFiles:
    """Load a llama / qwen2 / qwen3 GGUF file, from its cache entry when one is complete.

    First load (SmolLM2-135M Q4_1: ~15 s): parse the GGUF, build config and tokenizer, dequantize
    every tensor to float32 and publish the cache entry. Later loads read config.json, the saved
    tokenizer and the safetensors header only. ``tokenizer``: an optional separate tokenizer path.

    Raises:
        FileNotFoundError: ``path`` or ``tokenizer`` missing.
        ValueError: not a GGUF, unsupported architecture / rope scaling / tensor.
    """
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path!r} does not exist")
    key = source_key(path)
    entry = entry_dir(key)
    if is_complete(entry, key):
        files = _from_cache(path, str(entry), tokenizer)
        if files is not None:
            return files
    return _convert(path, key, tokenizer)
