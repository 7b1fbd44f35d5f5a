"""Speculative decoding: proposers (n-gram, draft model, MTP, test proposers) and verification."""

from __future__ import annotations

import logging

from mtpserve.config import SpeculativeConfig
from mtpserve.spec.load_gate import LoadGate
from mtpserve.spec.policy import DraftLengthPolicy
from mtpserve.spec.proposer import Proposer
from mtpserve.spec.shared_acceptance import SharedAcceptance

logger = logging.getLogger(__name__)


# Extra cost of verifying one more token, in decode steps: decoding is memory-bound, so a few more
# query tokens cost little (measured on CPU: 4 tokens 1.1-1.3x one; benchmarks/cpu_linear.py).
VERIFY_COST_PER_TOKEN = {"cpu": 0.1, "cuda": 0.03}


def build_proposer(spec: SpeculativeConfig | None, engine) -> Proposer | None:
    """The proposer ``spec`` asks for, wired to ``engine``'s target model (None: no speculation).

    Raises:
        ValueError: an algorithm the target model cannot use.
    """
    if spec is None:
        return None
    algo, k = spec.algorithm, spec.num_steps
    if algo in ("forced_accept", "forced_reject"):
        from mtpserve.spec.forced import ForcedAcceptProposer, ForcedRejectProposer
        from mtpserve.spec.draft_model import build_draft_runner

        runner = build_draft_runner(engine.config, "self", engine.runner, engine.max_model_len)
        cls = ForcedAcceptProposer if algo == "forced_accept" else ForcedRejectProposer
        return cls(k, runner, engine.eos_token_ids)
    if algo == "ngram":
        from mtpserve.spec.ngram import NgramProposer

        return NgramProposer(k, spec.ngram_min, spec.ngram_max, _policy(spec, engine, 0.0))
    if algo == "draft":
        from mtpserve.spec.draft_model import DraftModelProposer, build_draft_runner

        runner = build_draft_runner(engine.config, spec.draft_model_path, engine.runner,
                                    engine.max_model_len)
        ratio = _num_params(runner.model) / _num_params(engine.runner.model)
        return DraftModelProposer(k, runner, engine.model_config.vocab_size, engine.eos_token_ids,
                                  policy=_policy(spec, engine, ratio, pooled=True))
    if algo in ("nextn", "mtp"):
        return _mtp_proposer(spec, engine)
    raise ValueError(f"unknown speculative algorithm {algo!r}")


# Starting acceptance estimate of an MTP layer's drafts. The MTP module is trained to predict the
# next-but-one token: DeepSeek-V3 reports 85-90% acceptance of its second-token prediction
# (arXiv 2412.19437, sec. 5.4.3). The n-gram prior (0.6) sits near the break-even of a k = 3
# step that costs ~2.1x a plain one (the hybrid MoE's MTP step on the H200): a request whose
# estimate is priced out never drafts, hence never learns its acceptance.
MTP_PRIOR = 0.8


def _policy(spec: SpeculativeConfig, engine, draft_cost: float,
            prior: float = 0.6, flat: bool = False, pooled: bool = False
            ) -> DraftLengthPolicy | None:
    """The adaptive draft-length policy; ``draft_cost`` is the proposer's cost per draft token
    in target decode steps, ``prior`` its starting acceptance estimate per request; ``flat``:
    the proposer's work barely grows with the drafts per sequence (an MTP chain: one graph,
    whose extra steps are small forwards of one layer), so the step timer does not scale a
    measured drafting time by the drafts (engine/step_timer.py); ``pooled``: requests start
    from the acceptance pooled over earlier ones and may be benched (spec/shared_acceptance.py:
    for a model that drafts, MTP or a draft model, whose acceptance is mostly the pair of models'
    and whose upkeep a benched request saves; an n-gram proposer's acceptance is the request's
    own text, so one request's says little about the next)."""
    if not spec.adaptive:
        return None
    alpha = VERIFY_COST_PER_TOKEN.get(engine.runner.device.type, 0.1)
    runner = engine.runner

    def step_cost(tokens: int, seqs: int) -> float | None:
        """Measured once CUDA graphs are captured: device time plus learned host time."""
        device = runner.graphs.step_cost(tokens) if runner.graphs is not None else None
        if device is None:
            return None
        return device + engine.step_timer.host_seconds(tokens, seqs)

    # the measured veto needs steady step times: CUDA graphs (on the CPU, the cost model alone)
    gate = LoadGate() if runner.device.type == "cuda" else None
    timer = engine.step_timer
    timer.drafting_scales = draft_cost > 0 and not flat   # engine/step_timer.py
    return DraftLengthPolicy(spec.num_steps, alpha + draft_cost, prior=prior,
                             step_cost=step_cost, draft_cost=draft_cost, gate=gate,
                             drafts_measured=lambda: timer.drafts_measured,
                             shared=SharedAcceptance() if pooled else None)


def _num_params(model) -> int:
    """Parameters by storage (``models.weights.parameter_storage``: views count once)."""
    from mtpserve.models.weights import parameter_storage

    return sum(n // size for n, size in parameter_storage(model))


def _mtp_proposer(spec: SpeculativeConfig, engine) -> Proposer:
    """The MTP proposer over the target's own ``mtp`` module (its own KV cache), drafting
    through the FR-Spec head over ``spec.token_map``'s tokens when one is given.

    Raises:
        ValueError: the model has no MTP layers, or its checkpoint lacks the ``mtp.*`` tensors
            (the message names them); a bad token map (spec/token_map.py, spec/draft_head.py);
            an FP8 draft head on a GPU older than compute capability 8.9 (``_draft_head``).
    """
    from mtpserve.engine.model_runner import ModelRunner
    from mtpserve.spec.mtp import MTPProposer

    target = engine.runner.model
    if getattr(target, "mtp", None) is None:
        missing = getattr(target, "mtp_missing", [])
        if missing:
            raise ValueError(f"--speculative-algorithm {spec.algorithm}: the checkpoint has no MTP "
                             f"weights; missing {len(missing)} tensors: {', '.join(missing[:6])}"
                             f"{' ...' if len(missing) > 6 else ''}")
        raise ValueError(f"--speculative-algorithm {spec.algorithm} needs a model with MTP layers "
                         f"(Qwen3-Next / Qwen3.5 with mtp_num_hidden_layers >= 1); "
                         f"{engine.model_config.model_type} has none")
    head = _draft_head(spec, engine)
    runner = ModelRunner(engine.config, engine.model_config, None, engine.max_model_len,
                         model=target.mtp, num_blocks=engine.runner.num_blocks)
    layers = engine.model_config.num_hidden_layers
    return MTPProposer(spec.num_steps, target, runner, engine.eos_token_ids,
                       _policy(spec, engine, 2.0 / layers, MTP_PRIOR, flat=True,
                               pooled=True), head=head)


def _draft_head(spec: SpeculativeConfig, engine):
    """The MTP drafts' LM head: the FR-Spec head over the engine's token map (read from
    ``spec.token_map`` at engine start), else the target's; behind an FP8 copy for greedy
    drafts with ``spec.draft_head_quantization`` "fp8".

    Raises:
        ValueError: FP8 on a CUDA device older than compute capability 8.9 (no FP8 E4M3
            conversions there).
    """
    import torch

    from mtpserve.spec.draft_head import build_draft_head

    ids, quant, dev = engine.token_map, spec.draft_head_quantization, engine.device
    if quant and dev.type == "cuda" and torch.cuda.get_device_capability(dev) < (8, 9):
        raise ValueError("--speculative-draft-head-quantization fp8 needs a GPU of compute "
                         "capability 8.9 or newer (Ada, Hopper, Blackwell)")
    if quant and dev.type != "cuda":
        logger.warning("--speculative-draft-head-quantization fp8 on %s: drafts go through a "
                       "float32 copy of the head made at every draft step (a reference for "
                       "tests, slower than no quantization)", dev.type)
    head = build_draft_head(engine.runner.model, ids, quant)
    if ids is not None:
        weight = getattr(head, "base", head).weight   # the FR-Spec head's, behind an FP8 copy
        logger.info("FR-Spec draft head: %d of %d tokens from %s (+%.1f MiB)", ids.numel(),
                    engine.model_config.vocab_size, spec.token_map,
                    weight.numel() * weight.element_size() / 2**20)
    if quant:
        logger.info("FP8 draft head for greedy drafts (+%.1f MiB)", head.nbytes() / 2**20)
    return head


def draft_head_bytes(token_ids, hidden_size: int, dtype, vocab_size: int = 0,
                     quantization: str | None = None) -> int:
    """Bytes the draft head (spec/draft_head.py) will take once the proposer is built, after
    the KV cache is sized: rows of the token map ``token_ids`` [V_sub] x ``hidden_size`` x
    ``dtype``'s bytes (0 without a token map, None), plus with ``quantization`` "fp8" its FP8
    copy: one byte a weight and a float32 scale a row, over the map's rows or all
    ``vocab_size``."""
    rows = vocab_size if token_ids is None else token_ids.numel()
    own = 0 if token_ids is None else rows * hidden_size * dtype.itemsize
    return own + (rows * (hidden_size + 4) if quantization == "fp8" else 0)


def target_kv_share(spec: SpeculativeConfig | None, num_attention_layers: int) -> float:
    """Fraction of the GPU's KV budget the target takes; the proposer's own KV cache (same
    number of blocks) gets the rest: MTP has one attention layer, a self-drafting proposer as
    many as the target, another draft model (unknown yet) is given 30%."""
    if spec is None or spec.algorithm == "ngram":
        return 1.0
    if spec.algorithm in ("nextn", "mtp"):
        return num_attention_layers / (num_attention_layers + 1)
    if spec.algorithm == "draft" and spec.draft_model_path not in ("self", "target"):
        return 0.7
    return 0.5
