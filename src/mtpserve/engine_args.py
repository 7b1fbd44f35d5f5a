"""Command-line flags that build an ``EngineConfig`` (names follow vLLM / SGLang)."""

from __future__ import annotations

import argparse

from mtpserve.config import EngineConfig, SpeculativeConfig

SPEC_ALGORITHMS = ("ngram", "draft", "nextn", "mtp", "forced_accept", "forced_reject")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Add the model / engine / speculative flags to ``p``."""
    p.add_argument("model_pos", nargs="?", metavar="MODEL",
                   help="HF directory or GGUF file (default: SmolLM2-135M-Instruct Q4_1 GGUF)")
    p.add_argument("--model", help="same as the positional MODEL")
    p.add_argument("--tokenizer", help="tokenizer path (default: the model's)")
    p.add_argument("--served-model-name", help="model name clients use (default: file stem)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: float32 on CPU, bfloat16 on GPU")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--max-model-len", type=int, help="context length (prompt + output), tokens")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    p.add_argument("--kv-cache-memory", type=float, metavar="GiB",
                   help="KV-cache size on CPU in GiB (default 1)")
    p.add_argument("--num-kv-blocks", type=int, help="exact number of KV blocks (overrides size)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="most requests per step")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="token budget per step; longer prefills are chunked")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0, help="seed of unseeded requests' sampling")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--cuda-graph-max-tokens", type=int,
                   help="largest decode/verify step (tokens) captured as a CUDA graph "
                        "(default: max-num-seqs x (1 + speculative steps); for attention-only "
                        "models at least max-num-seqs + 15, so that a step admitting a request "
                        "whose prompt is cached but for its last block stays a graph)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of GPU memory for weights, activations and the KV cache")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="prepare each step on the host while the previous one runs on the "
                        "device (default: on with CUDA, off on the CPU, where it can be turned "
                        "on; steps that draft, or serve penalties or min_tokens, run "
                        "synchronously)")
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--speculative-algorithm", choices=SPEC_ALGORITHMS,
                   help="proposer; nextn and mtp are the same (the checkpoint's MTP layers); "
                        "forced_accept / forced_reject are test proposers (drafts the target "
                        "always / never accepts)")
    g.add_argument("--speculative-num-steps", type=int, default=3, help="draft tokens per step (k)")
    g.add_argument("--speculative-num-draft-tokens", type=int,
                   help="tokens verified per step (k + 1 for a chain)")
    g.add_argument("--speculative-ngram-min", type=int, default=1, help="shortest n-gram matched")
    g.add_argument("--speculative-ngram-max", type=int, default=4, help="longest n-gram matched")
    g.add_argument("--speculative-draft-model-path", help="draft model (same tokenizer)")
    g.add_argument("--speculative-adaptive", action=argparse.BooleanOptionalAction, default=True,
                   help="per request, draft only as many tokens as its acceptance pays for")
    g.add_argument("--speculative-token-map", metavar="PATH",
                   help="nextn/mtp: restrict the draft LM head to these token ids (FR-Spec): a "
                        ".pt file of a 1-D integer tensor or a .json list of ints; lossless, "
                        "verification uses the full LM head")
    g.add_argument("--speculative-draft-head-quantization", choices=("fp8",),
                   help="nextn/mtp: greedy drafts through an FP8 (E4M3, a scale per row) copy "
                        "of the draft LM head, half its bytes a draft step (GPUs of compute "
                        "capability 8.9+; on the CPU a slow reference, for tests); lossless, "
                        "verification uses the full LM head")


def engine_config_from_args(a: argparse.Namespace) -> EngineConfig:
    """Build the engine config; raises ``ValueError`` on contradicting flags."""
    if a.model and a.model_pos and a.model != a.model_pos:
        raise ValueError(f"two models given: {a.model_pos!r} and --model {a.model!r}")
    spec = None
    if a.speculative_token_map and not a.speculative_algorithm:
        raise ValueError("--speculative-token-map needs --speculative-algorithm nextn (or mtp): "
                         "the map restricts the MTP drafts' LM head")
    if a.speculative_draft_head_quantization and not a.speculative_algorithm:
        raise ValueError("--speculative-draft-head-quantization needs --speculative-algorithm "
                         "nextn (or mtp): it quantizes the MTP drafts' LM head")
    if a.speculative_algorithm:
        spec = SpeculativeConfig(
            algorithm=a.speculative_algorithm, num_steps=a.speculative_num_steps,
            num_draft_tokens=a.speculative_num_draft_tokens, ngram_min=a.speculative_ngram_min,
            ngram_max=a.speculative_ngram_max, draft_model_path=a.speculative_draft_model_path,
            adaptive=a.speculative_adaptive, token_map=a.speculative_token_map,
            draft_head_quantization=a.speculative_draft_head_quantization)
    kv = None if a.kv_cache_memory is None else int(a.kv_cache_memory * 2**30)
    return EngineConfig(
        model=a.model or a.model_pos, tokenizer=a.tokenizer,
        served_model_name=a.served_model_name, dtype=a.dtype, device=a.device,
        max_model_len=a.max_model_len, block_size=a.block_size, kv_cache_memory_bytes=kv,
        num_kv_blocks=a.num_kv_blocks, max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens,
        enable_prefix_caching=a.enable_prefix_caching, seed=a.seed, speculative=spec,
        enforce_eager=a.enforce_eager, cuda_graph_max_tokens=a.cuda_graph_max_tokens,
        gpu_memory_utilization=a.gpu_memory_utilization, async_scheduling=a.async_scheduling)
