"""ModelFiles: what a loaded checkpoint offers the engine (config, tokenizer, weight stream)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:  # imported where weights are read, not with the module
    import torch
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

WeightStream = Iterator["tuple[str, torch.Tensor]"]


def iter_safetensors(path: str) -> WeightStream:
    """Yield ``(name, tensor)`` for each tensor of one safetensors file, one at a time, on CPU in
    the stored dtype (names in the file's sorted order)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        for name in f.keys():
            yield name, f.get_tensor(name)


@dataclass
class ModelFiles:
    """A resolved checkpoint.

    - ``hf_config``: the transformers config (e.g. ``LlamaConfig`` for SmolLM2; ``tie_word_embeddings``
      is True when a GGUF has no ``output.weight``).
    - ``tokenizer``: a transformers tokenizer, ``chat_template`` set when the model has one.
    - ``source``: absolute path of the GGUF file or HF directory; ``kind``: ``"gguf"`` or ``"hf"``.
    - ``weight_files``: the safetensors files ``iter_weights`` reads (for a GGUF: the cached
      conversion), in order; ``cache_dir``: the GGUF's cache entry, None for HF directories or when
      the cache could not be written.
    - ``weight_stream``: when set, ``iter_weights`` yields from it instead of ``weight_files`` (a
      GGUF dequantized on the fly when no cache could be written).
    """

    hf_config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase
    source: str
    kind: str
    weight_files: tuple[str, ...] = ()
    cache_dir: str | None = None
    weight_stream: Callable[[], WeightStream] | None = field(default=None, repr=False)

    def iter_weights(self) -> WeightStream:
        """Yield ``(hf_name, tensor)`` pairs one at a time, CPU tensors.

        Names are HF parameter names (``model.embed_tokens.weight``,
        ``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight`` only when the checkpoint has
        its own, ...; HF directories pass names through unchanged, ``mtp.*`` included). GGUF weights
        are float32 (quantized ones dequantized, llama q/k rows in HF order); safetensors keep their
        stored dtype. Only the tensor being yielded is held.
        """
        if self.weight_stream is not None:
            yield from self.weight_stream()
            return
        for path in self.weight_files:
            yield from iter_safetensors(path)
