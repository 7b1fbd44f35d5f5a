"""The synchronous engine: add requests, call ``step()`` until they finish."""

from __future__ import annotations

import logging
import time

import torch

from mtpserve.config import EngineConfig, ModelConfig
from mtpserve.engine.block_manager import BlockManager
from mtpserve.engine.detokenizer import IncrementalDetokenizer
from mtpserve.engine.model_runner import ModelRunner
from mtpserve.engine.sampler import Sampler, SamplingRow
from mtpserve.engine.scheduler import ScheduledSeq, Scheduler
from mtpserve.engine.sequence import Sequence
from mtpserve.engine.validation import validate_request
from mtpserve.outputs import RequestOutput
from mtpserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine:
    """Continuous-batching engine over one model.

    Args:
        config: engine settings.
        files: already-loaded ``ModelFiles`` (default: ``load_model_files(config.model)``).

    Raises:
        ValueError: the KV cache cannot hold one ``max_model_len`` sequence, or the model is
            unsupported.
    """

    def __init__(self, config: EngineConfig, files=None):
        from mtpserve.loader import load_model_files

        t0 = time.perf_counter()
        files = files or load_model_files(config.model, config.tokenizer)
        self.config = config
        self.tokenizer = files.tokenizer
        self.model_config = ModelConfig.from_hf(files.hf_config)
        mc = self.model_config
        self.max_model_len = config.max_model_len or mc.max_position_embeddings
        eos = set(mc.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = tuple(sorted(eos))
        self.runner = ModelRunner(config, mc, files, self.max_model_len)
        self._check_kv_capacity()
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size,
                                          config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs,
                                   config.max_num_batched_tokens)
        self.sampler = Sampler(mc.vocab_size, seed=config.seed)
        self.seqs: dict[str, Sequence] = {}
        self.device = self.runner.device
        logger.info("engine built in %.1f s (%s, %s, max_model_len %d)", time.perf_counter() - t0,
                    mc.model_type, self.runner.dtype, self.max_model_len)

    def _check_kv_capacity(self) -> None:
        capacity = self.runner.num_blocks * self.config.block_size
        if capacity < self.max_model_len:
            raise ValueError(f"the KV cache holds {capacity} tokens, less than max_model_len "
                             f"({self.max_model_len}); lower --max-model-len or give the cache "
                             f"more memory")

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams) -> None:
        """Queue a request (``params.n`` must be 1: fan-out happens above the engine).

        Raises:
            SamplingParamsError: the request cannot be served (see ``validate_request``).
            ValueError: duplicate request id.
        """
        if request_id in self.seqs:
            raise ValueError(f"duplicate request id {request_id!r}")
        validate_request(prompt_token_ids, params, self.model_config.vocab_size, self.max_model_len)
        detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                       params.stop, params.include_stop_str_in_output)
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
        seq = Sequence(request_id, prompt_token_ids, params, self.eos_token_ids,
                       self.max_model_len, detok, gen)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        """Drop a request and free its blocks (no-op for an unknown or finished id)."""
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.scheduler.remove(seq)
            seq.finish("abort")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one forward pass over the scheduled batch; return each touched request's delta."""
        sched = self.scheduler.schedule()
        if not sched.scheduled:
            return []
        batch, layout = self.runner.prepare(sched)
        _, logits = self.runner.execute(batch)
        sampling = [s for s in sched.scheduled if s.samples]
        for s in sched.scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens
        if sampling:  # a step of prefill chunks only samples nothing
            result = self.sampler.sample(logits, [self._row(s.seq) for s in sampling])
            token_ids = result.token_ids.tolist()
            for i, s in enumerate(sampling):
                lp = result.logprobs[i] if result.logprobs is not None else None
                s.seq.append_token(token_ids[i], lp)
        outputs = []
        for s in sched.scheduled:
            outputs.extend(self._postprocess(s))
        return outputs

    def _row(self, seq: Sequence) -> SamplingRow:
        return SamplingRow(seq.params, seq.generator, seq.prompt_token_ids, seq.output_token_ids,
                           self.eos_token_ids)

    def _postprocess(self, s: ScheduledSeq) -> list[RequestOutput]:
        seq = s.seq
        self.block_manager.register_full_blocks(seq)
        if seq.is_finished:
            self.scheduler.remove(seq)
            self.seqs.pop(seq.request_id, None)
        return [seq.take_output()] if s.samples else []

    # ---- utilities ---------------------------------------------------------------------------
    def warmup(self) -> None:
        """Serve one short internal request end to end (readiness means this worked)."""
        rid = "__warmup__"
        ids = self.tokenizer.encode("Hello") or [0]
        self.add_request(rid, ids, SamplingParams(max_tokens=2, temperature=0.0))
        while rid in self.seqs:
            self.step()

    def stats(self) -> dict[str, float]:
        return {"num_running": len(self.scheduler.running),
                "num_waiting": len(self.scheduler.waiting),
                "kv_cache_usage": self.block_manager.usage(),
                "num_preemptions": self.scheduler.num_preemptions}
