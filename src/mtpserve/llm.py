"""Offline Python API: ``LLM(model).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence as Seq

from mtpserve.config import EngineConfig, SpeculativeConfig
from mtpserve.engine.fanout import child_params, child_request_id
from mtpserve.engine.validation import validate_request
from mtpserve.outputs import CompletionOutput, GenerateResult
from mtpserve.sampling_params import SamplingParams

_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}


class LLM:
    """Generate completions in-process, batching all prompts together.

    Args:
        model: HF directory or GGUF file; None for the default SmolLM2-135M-Instruct.
        **kwargs: any ``EngineConfig`` field (``dtype``, ``max_model_len``, ``num_kv_blocks``,
            ...), plus ``speculative_algorithm``, ``speculative_num_steps`` and the other
            ``speculative_*`` names, which build the ``SpeculativeConfig``.

    Raises:
        TypeError: an unknown keyword argument.
    """

    def __init__(self, model: str | None = None, **kwargs):
        from mtpserve.engine.engine import LLMEngine

        spec = {k[len("speculative_"):]: kwargs.pop(k) for k in list(kwargs)
                if k.startswith("speculative_")}
        unknown = set(kwargs) - _FIELDS
        if unknown:
            raise TypeError(f"unknown LLM argument(s): {', '.join(sorted(unknown))}")
        if spec:
            kwargs["speculative"] = SpeculativeConfig(**spec)
        self.config = EngineConfig(model=model, **kwargs)
        self.engine = LLMEngine(self.config)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    @classmethod
    def from_config(cls, config: EngineConfig) -> "LLM":
        """Build from a ready ``EngineConfig`` (what the CLI does)."""
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)})

    def generate(self, prompts: str | Seq[str] | Seq[Seq[int]],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None
                 ) -> list[GenerateResult]:
        """Complete each prompt (text, or token ids); one result per prompt, in order.

        Raises:
            SamplingParamsError: a prompt or parameter the engine cannot serve.
        """
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        params = sampling_params or SamplingParams()
        params = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        eng = self.engine
        for prompt_ids, p in zip(ids, params):  # all or nothing: check before queueing any
            validate_request(prompt_ids, p, eng.model_config.vocab_size, eng.max_model_len)
        results, by_rid = [], {}
        for prompt_ids, p in zip(ids, params):
            res = GenerateResult(prompt_ids, [CompletionOutput(i) for i in range(p.n)])
            results.append(res)
            base = f"gen-{next(self._ids)}"
            for i in range(p.n):
                rid = child_request_id(base, i, p.n)
                self.engine.add_request(rid, prompt_ids, child_params(p, i))
                by_rid[rid] = (res, i)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                res, i = by_rid[out.request_id]
                res.outputs[i].add(out)
                res.num_cached_tokens = max(res.num_cached_tokens, out.num_cached_tokens)
        return results

    def chat(self, messages: list[dict], sampling_params: SamplingParams | None = None
             ) -> GenerateResult:
        """Apply the model's chat template to one conversation and complete it."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=True, return_dict=False)
        return self.generate([list(ids)], sampling_params)[0]
