"""HF checkpoint directories: config.json + model.safetensors (or a sharded index)."""

from __future__ import annotations

import json
import os

from .configs import load_config
from .model_files import ModelFiles
from .tokenizer import load_tokenizer

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(folder: str) -> tuple[str, ...]:
    """The weight files of an HF directory: ``model.safetensors``, else the shards named by
    ``model.safetensors.index.json`` (its ``weight_map`` values, sorted).

    Raises:
        FileNotFoundError: when neither exists, or a shard named by the index is missing.
    """
    single = os.path.join(folder, SINGLE_FILE)
    if os.path.isfile(single):
        return (single,)
    index = os.path.join(folder, INDEX_FILE)
    if not os.path.isfile(index):
        bins = [n for n in os.listdir(folder) if n.endswith(".bin")]
        extra = f" (found {', '.join(sorted(bins))}: .bin weights are not supported)" if bins else ""
        raise FileNotFoundError(f"{folder}: no weights: expected {SINGLE_FILE} or {INDEX_FILE}{extra}")
    with open(index) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    missing = [s for s in shards if not os.path.isfile(os.path.join(folder, s))]
    if missing:
        raise FileNotFoundError(f"{folder}: shards named in {INDEX_FILE} are missing: {missing}")
    return tuple(os.path.join(folder, s) for s in shards)


def load_hf_dir(folder: str, tokenizer: str | None = None) -> ModelFiles:
    """Load an HF directory: config via ``AutoConfig.from_pretrained`` (any model type, e.g.
    llama, qwen2, qwen3, qwen3_next, qwen3_5, qwen3_5_moe; through ``configs.load_config``, which
    keeps transformers 5.17 from importing torch._dynamo and sympy for it), tokenizer from
    ``tokenizer`` or the directory (``load_tokenizer``), tensors streamed from the safetensors
    files with names unchanged.

    Raises:
        FileNotFoundError: no ``config.json``, no weights, a missing shard, or no tokenizer files.
    """
    folder = os.path.abspath(folder)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise FileNotFoundError(f"{folder}: no config.json")
    files = safetensors_files(folder)
    config = load_config(folder)
    tok = load_tokenizer(tokenizer or folder)
    return ModelFiles(hf_config=config, tokenizer=tok, source=folder, kind="hf", weight_files=files)
