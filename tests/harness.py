"""Drive the model runner directly (no scheduler policy) to compare logits with HF transformers."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mtpserve.config import EngineConfig, ModelConfig
from mtpserve.engine.block_manager import BlockManager
from mtpserve.engine.model_runner import ModelRunner
from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from mtpserve.engine.sequence import Sequence
from mtpserve.sampling_params import SamplingParams


def tiny_hf_model(model_type: str, seed: int = 0, **overrides):
    """A random-weight float32 transformers causal LM of the given architecture."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=512, tie_word_embeddings=False)
    kw.update(overrides)
    cfg = AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # default init (std 0.02) gives near-uniform logits: spread them out
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    return model


class Harness:
    """Our ModelRunner over an in-memory HF model's weights, float32 on CPU."""

    def __init__(self, hf_model, block_size: int = 4, num_blocks: int = 128, max_len: int = 512):
        sd = hf_model.state_dict()
        files = SimpleNamespace(hf_config=hf_model.config, tokenizer=None,
                                iter_weights=lambda: iter(sd.items()))
        cfg = EngineConfig(device="cpu", dtype="float32", num_kv_blocks=num_blocks,
                           block_size=block_size, enable_prefix_caching=False)
        self.model_config = ModelConfig.from_hf(hf_model.config)
        self.runner = ModelRunner(cfg, self.model_config, files, max_len)
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=False)

    def new_seq(self, token_ids: list[int], rid: str = "r") -> Sequence:
        return Sequence(rid, token_ids, SamplingParams(), (), 10**6, None, None)

    def run(self, work: list[tuple[Sequence, int]]) -> list[torch.Tensor]:
        """Compute the next ``n`` tokens of each ``(seq, n)`` in ONE batch; return each one's
        logits [n, vocab] for those positions."""
        sched = SchedulerOutput()
        for seq, n in work:
            assert self.bm.allocate(seq, seq.num_computed_tokens + n)
            sched.scheduled.append(ScheduledSeq(seq, n, []))
        batch, _ = self.runner.prepare(sched)
        hidden, _ = self.runner.execute(batch)
        with torch.inference_mode():
            logits = self.runner.model.compute_logits(hidden)
        out, start = [], 0
        for seq, n in work:
            out.append(logits[start:start + n])
            start += n
            seq.num_computed_tokens += n
        return out


def logits_of_prompt(engine, token_ids: list[int]) -> torch.Tensor:
    """Logits [len, vocab] at every position of one prefill through a live engine's runner and
    KV pool (the blocks are returned afterwards)."""
    seq = Sequence("probe", token_ids, SamplingParams(), (), engine.max_model_len, None, None)
    assert engine.block_manager.allocate(seq, len(token_ids))
    try:
        batch, _ = engine.runner.prepare(SchedulerOutput([ScheduledSeq(seq, len(token_ids), [])]))
        hidden, _ = engine.runner.execute(batch)
        with torch.inference_mode():
            return engine.runner.model.compute_logits(hidden)
    finally:
        engine.block_manager.free_seq(seq)
