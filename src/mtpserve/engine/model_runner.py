"""Owns the model and its KV cache; turns a schedule into a ForwardBatch and runs it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from mtpserve.config import EngineConfig, ModelConfig
from mtpserve.engine.batch_layout import batch_layout
from mtpserve.engine.forward_batch import ForwardBatch, to_device
from mtpserve.engine.kv_cache import KVCache
from mtpserve.engine.state_cache import LinearAttnMetadata, StateCache
from mtpserve.engine.scheduler import SchedulerOutput
from mtpserve.kernels import cpu_linear
from mtpserve.kernels.paged_attention import (SMALL_QUERY, TritonAttentionMetadata,
                                              build_torch_metadata, partition_size)
from mtpserve.models.registry import model_class
from mtpserve.models.weights import parameter_storage, process_weights_after_loading

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_BYTES = 1 << 30


@dataclass
class LogitsLayout:
    """Where each scheduled sequence's logits rows are: ``rows[i]`` is a ``(start, count)`` pair
    into the logits tensor for ``scheduled[i]`` (count 0 when it does not sample this step)."""

    rows: list[tuple[int, int]]


class ModelRunner:
    """Builds the model on the device, loads weights, sizes the paged KV cache, runs steps.

    Args:
        config: engine settings (device, dtype, KV size); model_config: the model's shape;
        files: a ``mtpserve.loader.ModelFiles`` to read weights from (unused with ``model``);
        max_model_len: longest sequence (sizes the RoPE table); model: an already-loaded model
        to share (a self-drafting proposer runs the target's weights over its own KV cache);
        state_slots: recurrent-state slots of a hybrid model (default: ``max_num_seqs``);
        num_blocks: KV blocks (a proposer's pool mirrors the target's; a target sizes its own and
        leaves its proposer's KV cache a share of the GPU budget, ``spec.target_kv_share``);
        reserve_bytes: device bytes kept out of the KV budget for what is built after the KV
        cache is sized (the FR-Spec draft head and the FP8 draft head's copy,
        ``spec.draft_head_bytes``).
    """

    def __init__(self, config: EngineConfig, model_config: ModelConfig, files, max_model_len: int,
                 model: torch.nn.Module | None = None, state_slots: int | None = None,
                 num_blocks: int | None = None, reserve_bytes: int = 0):
        self.config, self.model_config = config, model_config
        self.reserve_bytes = reserve_bytes
        self.device, self.dtype = config.torch_device(), config.torch_dtype()
        self.block_size = config.block_size
        cuda = self.device.type == "cuda"
        self.mem_at_start = torch.cuda.memory_allocated(self.device) if cuda else 0
        self.model = model if model is not None else self._load_model(files, max_model_len)
        a = self.model.attention_layers()[0]
        self._kv_shape = (len(self.model.attention_layers()), a.num_kv_heads, a.head_dim)
        self.max_model_len = max_model_len
        self.triton_attention = self.device.type == "cuda"
        self.part_size = partition_size(max_model_len, self.block_size)
        self.graphs = None
        self.state_cache = self._state_cache(state_slots or config.max_num_seqs)
        self.num_blocks = num_blocks or self._num_blocks()
        # one block more than the block manager hands out: padded graph tokens write there
        self.kv_cache = KVCache(self._kv_shape[0], self.num_blocks + 1, self.block_size,
                                *self._kv_shape[1:], self.dtype, self.device)
        self.pad_slot = self.num_blocks * self.block_size

    # ---- start-up ------------------------------------------------------------------------
    def _load_model(self, files, max_model_len: int) -> torch.nn.Module:
        t0 = time.perf_counter()
        cls = model_class(self.model_config)
        prev = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                model = cls(self.model_config, max_model_len)
        finally:
            torch.set_default_dtype(prev)
        model.load_weights((n, t.to(self.dtype)) for n, t in files.iter_weights())
        process_weights_after_loading(model)
        nbytes = sum(n for n, _ in parameter_storage(model))
        logger.info("model weights loaded: %.2f GiB on %s in %.1f s", nbytes / 2**30, self.device,
                    time.perf_counter() - t0)
        added = cpu_linear.pack_model_linears(model)
        if added:
            logger.info("packed float32 CPU weights for multi-row matmuls (+%.0f MiB)", added / 2**20)
        return model.eval()

    def _state_cache(self, slots: int) -> StateCache | None:
        """Recurrent-state slots for hybrid models, else None."""
        layers = getattr(self.model, "linear_attention_layers", lambda: [])()
        if not layers:
            return None
        spec = self.config.speculative
        k = spec.num_steps if spec is not None else 0
        return StateCache(len(layers), layers[0].state_shape, slots, self.dtype, torch.float32,
                          self.device, max_drafts=k, scratch_rows=self.config.max_num_seqs)

    def kv_bytes_per_block(self) -> int:
        return KVCache.bytes_per_block(self._kv_shape[0], self.block_size, *self._kv_shape[1:],
                                       self.dtype)

    def _num_blocks(self) -> int:
        if self.config.num_kv_blocks:
            return self.config.num_kv_blocks
        if self.device.type == "cuda":
            from mtpserve.engine.memory_profile import gpu_kv_blocks

            return gpu_kv_blocks(self)
        budget = self.config.kv_cache_memory_bytes or DEFAULT_CPU_KV_BYTES
        return max(1, budget // self.kv_bytes_per_block())

    # ---- per step ----------------------------------------------------------------------------
    def prepare(self, sched: SchedulerOutput) -> tuple[ForwardBatch, LogitsLayout]:
        """Flatten the scheduled sequences into one varlen batch (engine/batch_layout.py): two
        host-to-device copies (the int64 arrays, the int32 ones), from pinned memory and
        asynchronous on CUDA."""
        lay = batch_layout(sched.scheduled, self.block_size)
        qlens, slens, tables = lay.qlens, lay.slens, lay.tables
        T, B, width, bs = lay.num_tokens, len(qlens), lay.width, self.block_size
        i64 = to_device(lay.i64, torch.int64, self.device)
        i32 = to_device(lay.i32, torch.int32, self.device)
        # the views in four split calls (a slice each costs the host a few us)
        token_io, qlen_t, slen_t, logits_t = i64.split([3 * T, B, B, lay.num_logits])
        starts, rows_io, tables_t = i32.split([B + 1, 2 * T, B * width])
        ids_t, pos_t, slots_t = token_io.split(T)
        row_t, kv_len_t = rows_io.split(T)
        batch = ForwardBatch(
            input_ids=ids_t, positions=pos_t, slot_mapping=slots_t, query_lens=qlen_t,
            seq_lens=slen_t, logits_indices=logits_t, query_start_loc=starts,
            block_tables=tables_t.view(B, width), query_lens_cpu=qlens, seq_lens_cpu=slens,
            token_io=token_io, block_tables_cpu=tables)
        batch.kv_caches = self.kv_cache.layers
        if self.state_cache is not None:
            batch.extra["linear_attn"] = self._linear_attn_metadata(sched)
        if self.triton_attention and max(qlens) <= SMALL_QUERY:
            batch.attn = TritonAttentionMetadata(row_t, kv_len_t, batch.block_tables, bs,
                                                 self.part_size, rows_io=rows_io)
        else:
            batch.attn = build_torch_metadata(qlens, slens, batch.block_tables, bs, self.device,
                                              self.dtype)
        return batch, LogitsLayout(lay.rows)

    def _linear_attn_metadata(self, sched: SchedulerOutput) -> LinearAttnMetadata:
        slots = [s.seq.state_slot for s in sched.scheduled]
        rows, n = [], 0
        for s in sched.scheduled:
            rows.append(n if s.draft_token_ids else -1)
            n += bool(s.draft_token_ids)
        # the slots' device tensor is uploaded only if read: a graph step writes its own
        return LinearAttnMetadata(self.state_cache, None, slots, rows, self.device)

    def graph_token_limit(self, prefill_tail: bool = False) -> int:
        """Most tokens in a captured step: ``--cuda-graph-max-tokens``, else every sequence
        verifying k drafts (``max_num_seqs * (1 + k)``). ``prefill_tail`` (the attention-only
        graphs, which run any query of up to ``SMALL_QUERY`` tokens): also a full batch of
        decodes beside one prefill of that many tokens (``max_num_seqs - 1 + SMALL_QUERY``),
        the step that admits a request whose prompt is cached but for its last partial block.
        Capped at ``max_num_seqs`` tokens, plain decoding runs each such step eagerly. With
        prompts that repeat, at 64 requests on the H100 (session 39), plain decoding reached
        14.5-20.7k tok/s while the n-gram engine's plain steps (graphs up to 320 tokens) ran
        at 25-38k: likely this, not yet timed."""
        if self.config.cuda_graph_max_tokens:
            return self.config.cuda_graph_max_tokens
        spec = self.config.speculative
        k = spec.num_steps if spec is not None else 0
        B = self.config.max_num_seqs
        return max(B * (1 + k), B - 1 + SMALL_QUERY) if prefill_tail else B * (1 + k)

    def capture_cuda_graphs(self, runner_cls=None) -> None:
        """Capture decode / verify graphs on CUDA (cuda_graph.py; hybrid models:
        hybrid_graph.py). ``runner_cls``: a CudaGraphRunner subclass for an attention-only
        model with other inputs (the MTP module: spec/mtp_graph.py). A proposer's runner shares
        the engine's config, so its graphs have the target's token limit."""
        if self.device.type != "cuda":
            return
        from mtpserve.engine.cuda_graph import CudaGraphRunner, graph_sizes
        from mtpserve.engine.hybrid_graph import HybridGraphRunner

        spec = self.config.speculative
        k = spec.num_steps if spec is not None else 0
        limit = self.graph_token_limit(prefill_tail=self.state_cache is None)
        max_blocks = -(-self.max_model_len // self.block_size)
        if self.state_cache is not None:
            mtp = spec is not None and spec.algorithm in ("nextn", "mtp")
            self.graphs = HybridGraphRunner(self, limit, k, self.config.max_num_seqs, max_blocks,
                                            self.part_size, acceptance=mtp)
        else:
            self.graphs = (runner_cls or CudaGraphRunner)(
                self, graph_sizes(limit), self.config.max_num_seqs, max_blocks, self.part_size)
        self.graphs.capture()

    @torch.inference_mode()
    def execute(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the model; return (hidden [T, H], logits [N, vocab] float32 at logits_indices)."""
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.run(batch)
        hidden = self.model(batch)
        if batch.logits_indices.numel() == 0:
            return hidden, hidden.new_empty(0, self.model_config.vocab_size, dtype=torch.float32)
        logits = self.model.compute_logits(hidden[batch.logits_indices])
        return hidden, logits

