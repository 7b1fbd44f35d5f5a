"""Tiny random hybrid models (Qwen3-Next / Qwen3.5) and a runner harness with recurrent state."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from mtpserve.config import EngineConfig, ModelConfig, SpeculativeConfig
from mtpserve.engine.block_manager import BlockManager
from mtpserve.engine.forward_batch import ForwardBatch
from mtpserve.engine.model_runner import ModelRunner
from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from mtpserve.engine.sequence import Sequence
from mtpserve.kernels.paged_attention import build_torch_metadata
from mtpserve.sampling_params import SamplingParams

SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=512, tie_word_embeddings=False,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
             linear_value_head_dim=12, linear_conv_kernel_dim=4, full_attention_interval=2)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=48)


@contextmanager
def one_thread():
    """Run torch on one intra-op thread (restored after): tiny models gain nothing from threads,
    and on a busy 2-core machine every small parallel op can wait ~30 ms for the second core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def one_thread_module():
    """``one_thread`` for a whole test module: ``pytestmark =
    pytest.mark.usefixtures("one_thread_module")`` after importing this fixture."""
    with one_thread():
        yield


def tiny_hybrid_hf(model_type: str, seed: int = 0, **overrides):
    """A random float32 HF causal LM: ``qwen3_next``, ``qwen3_5`` or ``qwen3_5_moe`` (the latter
    two built from a top-level config with ``text_config``). Matrices ~ N(0, 0.12), zero-centred
    norm weights ~ N(0, 0.2), gated-norm weights ~ 1 + N(0, 0.2), dt_bias ~ N(1, 0.3), so that
    logits are spread and every convention (zero-centred or not) matters. A = exp(A_log) ~
    U(0.01, 1) instead of HF's U(0.01, 16): heads that forget almost everything at once give tiny
    outputs whose float32 rounding the gated RMSNorm blows up (HF's own float32 forward then
    misses its float64 one by ~3e-4 in the logits; with this range by <= 3e-5)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = {**SHAPE, **(MOE if model_type != "qwen3_5" else {}), **overrides}
    if model_type == "qwen3_next":
        cfg = AutoConfig.for_model(model_type, **kw)
    else:
        cfg = AutoConfig.for_model(model_type, text_config=kw,
                                   tie_word_embeddings=kw["tie_word_embeddings"])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            _randomise(name, p)
    return model, cfg


def _randomise(name: str, p: torch.Tensor) -> None:
    if p.dim() > 1:
        p.normal_(0, 0.12)
    elif name.endswith("A_log"):
        p.uniform_(0.01, 1).log_()
    elif name.endswith("linear_attn.norm.weight"):
        p.normal_(1, 0.2)
    elif name.endswith("norm.weight"):
        p.normal_(0, 0.2)
    elif name.endswith("dt_bias"):
        p.normal_(1, 0.3)


def random_mtp_weights(hf_model, seed: int = 7, per_expert: bool = True) -> dict:
    """Random ``mtp.*`` tensors for ``hf_model``: the decoder layer is shaped like the model's
    first full-attention layer (keep that layer's FFN kind equal to layer 0's, which the MTP
    layer follows); experts in the per-expert checkpoint layout when ``per_expert``."""
    cfg = hf_model.config
    full = cfg.layer_types.index("full_attention")
    H = cfg.hidden_size
    g = torch.Generator().manual_seed(seed)
    out = {"mtp.fc.weight": torch.randn(H, 2 * H, generator=g) * 0.15}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = torch.randn(H, generator=g) * 0.2
    prefix = f"model.layers.{full}."
    for name, t in hf_model.state_dict().items():
        if name.startswith(prefix):
            scale = 0.2 if t.dim() == 1 else 0.15
            out["mtp.layers.0." + name[len(prefix):]] = torch.randn(t.shape, generator=g) * scale
    if per_expert:
        out = _split_experts(out)
    return out


def _split_experts(sd: dict) -> dict:
    out = {}
    for name, t in sd.items():
        if name.endswith("experts.gate_up_proj"):
            base, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif name.endswith("experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t
    return out


class HybridHarness:
    """Our ModelRunner (float32, CPU) over in-memory weights, with recurrent-state slots and
    scratch rows for ``k`` drafts. Sequences get their state slot in :meth:`new_seq`."""

    def __init__(self, hf_model, weights: dict | None = None, hf_config=None, k: int = 4,
                 block_size: int = 4, num_blocks: int = 256, max_len: int = 512):
        sd = dict(hf_model.state_dict()) if weights is None else weights
        config = hf_config or hf_model.config
        files = SimpleNamespace(hf_config=config, tokenizer=None,
                                iter_weights=lambda: iter(sd.items()))
        cfg = EngineConfig(device="cpu", dtype="float32", num_kv_blocks=num_blocks,
                           block_size=block_size, enable_prefix_caching=False, max_num_seqs=16,
                           speculative=SpeculativeConfig("nextn", num_steps=k))
        self.model_config = ModelConfig.from_hf(config)
        self.runner = ModelRunner(cfg, self.model_config, files, max_len)
        self.model = self.runner.model
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=False)

    def new_seq(self, token_ids: list[int], rid: str = "r") -> Sequence:
        seq = Sequence(rid, token_ids, SamplingParams(), (), 10**6, None, None)
        seq.state_slot = self.runner.state_cache.alloc()
        return seq

    def release(self, *seqs: Sequence) -> None:
        """Return the sequences' KV blocks and state slots."""
        for seq in seqs:
            self.bm.free_seq(seq)
            self.runner.state_cache.free(seq.state_slot)

    def step(self, work: list[tuple]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One forward over ``(seq, n)`` or ``(seq, n, drafts)`` items (the next n tokens of seq,
        then the drafts); returns each item's logits [q, vocab] and hidden states [q, H]."""
        sched = SchedulerOutput()
        for item in work:
            seq, n, drafts = (*item, [])[:3]
            assert self.bm.allocate(seq, seq.num_computed_tokens + n + len(drafts))
            sched.scheduled.append(ScheduledSeq(seq, n, list(drafts)))
        batch, _ = self.runner.prepare(sched)
        hidden, _ = self.runner.execute(batch)
        with torch.inference_mode():
            logits = self.model.compute_logits(hidden)
        outs, hids, start = [], [], 0
        for s in sched.scheduled:
            q = s.num_query_tokens
            outs.append(logits[start:start + q])
            hids.append(hidden[start:start + q])
            start += q
            s.seq.num_computed_tokens += s.num_new_tokens
        return outs, hids

    def slot_states(self, seq: Sequence) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(conv, ssm) state of every linear-attention layer in ``seq``'s slot (copies)."""
        c = self.runner.state_cache
        return [(c.conv[i][seq.state_slot].clone(), c.ssm[i][seq.state_slot].clone())
                for i in range(len(c.conv))]


def single_seq_batch(input_ids: list[int], positions: list[int], kv_caches: list,
                     block_size: int) -> ForwardBatch:
    """A one-sequence ForwardBatch over its own KV pool whose block table is the identity
    (so the KV slot of position p is p): for driving the MTP module by hand."""
    dev, i64 = torch.device("cpu"), torch.int64
    q, seq_len = len(input_ids), positions[-1] + 1
    blocks = -(-seq_len // block_size)
    tables = torch.arange(blocks, dtype=torch.int32).unsqueeze(0)
    batch = ForwardBatch(
        input_ids=torch.tensor(input_ids, dtype=i64), positions=torch.tensor(positions, dtype=i64),
        slot_mapping=torch.tensor(positions, dtype=i64),
        query_start_loc=torch.tensor([0, q], dtype=torch.int32),
        query_lens=torch.tensor([q], dtype=i64), seq_lens=torch.tensor([seq_len], dtype=i64),
        block_tables=tables, logits_indices=torch.arange(q, dtype=i64),
        query_lens_cpu=[q], seq_lens_cpu=[seq_len])
    batch.kv_caches = kv_caches
    batch.attn = build_torch_metadata([q], [seq_len], tables, block_size, dev)
    return batch
