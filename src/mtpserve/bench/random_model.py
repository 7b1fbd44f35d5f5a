"""Random-weight models of real shapes, generated on the device (for GPU benchmarks and tests).

``random_model_files(name)`` returns a ``ModelFiles``-like object: the transformers config of a
known shape, a word-level tokenizer of the same vocabulary, and ``iter_weights`` yielding the
checkpoint's tensor names (taken from the transformers model built on the meta device, plus
``mtp.*`` for hybrid shapes) with N(0, std) values drawn directly on the device.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
                         rope_theta=100000.0, max_position_embeddings=8192),
    "qwen3-1.7b": dict(model_type="qwen3", vocab_size=151936, hidden_size=2048,
                       intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                       rope_theta=1000000.0, max_position_embeddings=40960),
    "qwen3-8b": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                     rope_theta=1000000.0, max_position_embeddings=40960),
    # two tiny layers over SmolLM2's vocabulary: the engine's host-side work dominates a step
    "tiny-llama": dict(model_type="llama", vocab_size=49152, hidden_size=64,
                       intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                       max_position_embeddings=4096),
    # a tiny hybrid MoE with one MTP layer: CPU smoke runs of the hybrid benchmarks
    "tiny-qwen3-next": dict(model_type="qwen3_next", vocab_size=512, hidden_size=64,
                            intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, full_attention_interval=4,
                            linear_num_key_heads=2, linear_num_value_heads=4,
                            linear_key_head_dim=16, linear_value_head_dim=16,
                            linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
                            moe_intermediate_size=32, shared_expert_intermediate_size=32,
                            tie_word_embeddings=False, mtp_num_hidden_layers=1,
                            max_position_embeddings=4096),
    # Qwen3-Next-like hybrid MoE of ~3B parameters with one MTP layer
    "qwen3-next-3b": dict(model_type="qwen3_next", vocab_size=151936, hidden_size=2048,
                          intermediate_size=5120, num_hidden_layers=12, num_attention_heads=16,
                          num_key_value_heads=2, head_dim=256, full_attention_interval=4,
                          linear_num_key_heads=16, linear_num_value_heads=32,
                          linear_key_head_dim=128, linear_value_head_dim=128,
                          linear_conv_kernel_dim=4, num_experts=64, num_experts_per_tok=8,
                          moe_intermediate_size=512, shared_expert_intermediate_size=512,
                          tie_word_embeddings=False, mtp_num_hidden_layers=1,
                          max_position_embeddings=32768),
}


def word_tokenizer(vocab_size: int, eos_id: int = 1):
    """Whitespace word-level tokenizer over ``w{i}``; ``<unk>`` = 0, ``</s>`` = ``eos_id``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    vocab.pop("w0"), vocab.pop(f"w{eos_id}")
    vocab.update({"<unk>": 0, "</s>": eos_id})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


def hf_config(name: str):
    """The transformers config of a known shape; raises ``KeyError`` naming the known ones."""
    from mtpserve.loader.configs import config_for_model

    if name not in SHAPES:
        raise KeyError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    kw = dict(SHAPES[name])
    cfg = config_for_model(kw.pop("model_type"), **kw)  # AutoConfig.for_model, lighter on 5.17
    cfg.eos_token_id = 1
    return cfg


def checkpoint_shapes(cfg) -> dict[str, torch.Size]:
    """Tensor names and shapes of the checkpoint transformers would write (+ ``mtp.*``)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    shapes = {n: p.shape for n, p in model.state_dict().items()}
    if getattr(cfg, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    if getattr(cfg, "mtp_num_hidden_layers", 0):
        shapes.update(_mtp_shapes(cfg, shapes))
    return shapes


def _mtp_shapes(cfg, shapes: dict) -> dict[str, torch.Size]:
    H = cfg.hidden_size
    prefix = f"model.layers.{cfg.layer_types.index('full_attention')}."
    out = {"mtp.fc.weight": torch.Size([H, 2 * H])}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = torch.Size([H])
    for name, shape in shapes.items():
        if name.startswith(prefix):
            out["mtp.layers.0." + name[len(prefix):]] = shape
    return out


def random_model_files(name: str, device: str = "cuda", std: float = 0.02, seed: int = 0):
    """Config, tokenizer and random weights of shape ``name`` (weights made on ``device``)."""
    cfg = hf_config(name)
    shapes = checkpoint_shapes(cfg)

    zero_centred = cfg.model_type.startswith("qwen3_next") or cfg.model_type.startswith("qwen3_5")

    def neutral(n: str) -> float | None:
        """Norm weights that scale by 1, A_log = 0 (A = 1), dt_bias = 0; None: random."""
        if n.endswith("A_log") or n.endswith("dt_bias"):
            return 0.0
        if n.endswith("norm.weight"):
            return 1.0 if (not zero_centred or n.endswith("linear_attn.norm.weight")) else 0.0
        return None

    def iter_weights():
        g = torch.Generator(device=device).manual_seed(seed)
        for n, shape in shapes.items():
            fill = neutral(n)
            if fill is not None:
                yield n, torch.full(shape, fill, device=device)
            else:
                yield n, torch.randn(shape, device=device, generator=g) * std

    return SimpleNamespace(hf_config=cfg, tokenizer=word_tokenizer(cfg.vocab_size),
                           source=f"random:{name}", kind="random", iter_weights=iter_weights)
