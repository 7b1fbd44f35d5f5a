"""Speculative decoding: proposers (n-gram, draft model, MTP, test proposers) and verification."""

from __future__ import annotations

from mtpserve.config import SpeculativeConfig
from mtpserve.spec.proposer import Proposer


def build_proposer(spec: SpeculativeConfig | None, engine) -> Proposer | None:
    """The proposer ``spec`` asks for, wired to ``engine``'s target model (None: no speculation).

    Raises:
        ValueError: an algorithm the target model cannot use.
    """
    if spec is None:
        return None
    algo, k = spec.algorithm, spec.num_steps
    if algo == "ngram":
        from mtpserve.spec.ngram import NgramProposer

        return NgramProposer(k, spec.ngram_min, spec.ngram_max)
    from mtpserve.spec.draft_model import DraftModelProposer, build_draft_runner

    if algo == "draft":
        runner = build_draft_runner(engine.config, spec.draft_model_path, engine.runner,
                                    engine.max_model_len)
        return DraftModelProposer(k, runner, engine.model_config.vocab_size, engine.eos_token_ids)
    if algo in ("forced_accept", "forced_reject"):
        from mtpserve.spec.forced import ForcedAcceptProposer, ForcedRejectProposer

        runner = build_draft_runner(engine.config, "self", engine.runner, engine.max_model_len)
        cls = ForcedAcceptProposer if algo == "forced_accept" else ForcedRejectProposer
        return cls(k, runner, engine.eos_token_ids)
    if algo in ("nextn", "mtp"):
        build_mtp = getattr(engine.runner.model, "build_mtp_proposer", None)
        if build_mtp is None:
            raise ValueError(f"--speculative-algorithm {algo} needs a model with MTP layers "
                             f"(Qwen3-Next / Qwen3.5 / DeepSeek-V3); "
                             f"{engine.model_config.model_type} has none")
        return build_mtp(spec, engine)
    raise ValueError(f"unknown speculative algorithm {algo!r}")
