"""Tiny hybrid checkpoints on disk (config.json + model.safetensors with mtp.* + a tokenizer), so
the whole engine (LLM, server) can load them like a real model directory."""

from __future__ import annotations

from pathlib import Path

import torch

EOS = 1


def word_tokenizer(vocab_size: int):
    """A whitespace word-level tokenizer over ``w2 .. w{V-1}`` with ``<unk>`` = 0, ``</s>`` = 1
    (prefix-stable decoding: tokens joined with spaces)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": EOS, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


def write_checkpoint(path: Path, hf_model, extra: dict[str, torch.Tensor] | None = None) -> Path:
    """Save ``hf_model``'s config and weights (plus ``extra`` tensors, e.g. ``mtp.*``) and a word
    tokenizer of the model's vocabulary size into ``path``; return it."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    cfg = hf_model.config
    text = getattr(cfg, "text_config", None) or cfg
    cfg.eos_token_id = EOS
    cfg.save_pretrained(path)
    tensors = {k: v.detach().contiguous().clone() for k, v in hf_model.state_dict().items()}
    tensors.update({k: v.contiguous() for k, v in (extra or {}).items()})
    save_file(tensors, str(path / "model.safetensors"))
    word_tokenizer(text.vocab_size).save_pretrained(path)
    return path


def random_mtp_checkpoint(path: Path):
    """A tiny random Qwen3-Next (harness_hybrid.tiny_hybrid_hf) with one random MTP layer,
    written to ``path``; returns (path, the HF model, its weights with the ``mtp.*`` tensors)."""
    from harness_hybrid import random_mtp_weights, tiny_hybrid_hf

    hf, _ = tiny_hybrid_hf("qwen3_next", mtp_num_hidden_layers=1)
    mtp = random_mtp_weights(hf)
    return write_checkpoint(path, hf, mtp), hf, {**hf.state_dict(), **mtp}
