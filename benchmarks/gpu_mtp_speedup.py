"""Per-request speed of MTP drafting against plain decoding, for each number of drafts accepted.

Random weights accept (almost) nothing, so the acceptance is forced: the MTP engine drafts as
always (observe, chain, draft heads all run on the device), then the drafts it proposes are
replaced by the target's own greedy continuation (read from a plain engine over the same
weights), right for the first ``a`` and wrong after, so every verify step of k drafts accepts
exactly ``a`` and emits ``a + 1`` tokens. The output must equal plain decoding (checked). Batch
1, greedy, adaptive off, a prompt of 128 tokens, ``--new`` tokens per request; time per step and
per emitted token (median over decode steps), and the speedup over plain decoding.

    python benchmarks/gpu_mtp_speedup.py [--shape qwen3-next-3b] [--k 3] [--json out.json]
    python benchmarks/gpu_mtp_speedup.py --shape tiny-qwen3-next --device cpu   # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from mtpserve.bench.random_model import random_model_files
from mtpserve.config import EngineConfig, SpeculativeConfig
from mtpserve.engine.engine import LLMEngine
from mtpserve.engine.forward_batch import to_device
from mtpserve.sampling_params import SamplingParams
from mtpserve.spec.pending_drafts import PendingDrafts

PROMPT = [(7 * j) % 500 + 2 for j in range(128)]


def build(shape: str, device: str, spec: SpeculativeConfig | None) -> LLMEngine:
    dtype = "bfloat16" if device == "cuda" else "float32"
    cfg = EngineConfig(dtype=dtype, device=device, max_model_len=1024, max_num_seqs=8,
                       gpu_memory_utilization=0.4, speculative=spec)
    return LLMEngine(cfg, files=random_model_files(shape, device=device))


def run(eng: LLMEngine, new: int) -> tuple[list[int], float, float]:
    """One greedy request: (its tokens, median seconds per decode step, tokens per step)."""
    rid = f"r{time.monotonic_ns()}"
    eng.add_request(rid, PROMPT, SamplingParams(max_tokens=new, temperature=0.0,
                                                ignore_eos=True))
    times, emitted, tokens = [], [], []
    while eng.has_unfinished_requests():
        decoding = not eng.scheduler.waiting and not any(s.in_prefill
                                                         for s in eng.scheduler.running)
        t = time.perf_counter()
        outs = eng.step()
        n = sum(len(o.new_token_ids) for o in outs)
        tokens += [t for o in outs for t in o.new_token_ids]
        if decoding and n:
            times.append(time.perf_counter() - t)
            emitted.append(n)
    return tokens, statistics.median(times), statistics.mean(emitted)


def force_acceptance(eng: LLMEngine, reference: list[int], accept: int) -> None:
    """After each greedy drafting of ``eng``'s MTP proposer, propose ``reference`` (the greedy
    continuation of PROMPT) right for the first ``accept`` drafts and wrong after (a later call
    replaces the earlier one)."""
    p, vocab = eng.proposer, eng.model_config.vocab_size
    draft_greedy = type(p)._draft_greedy.__get__(p)   # the proposer's own, not an earlier wrap

    def forced(active):
        draft_greedy(active)   # the device work as always; its drafts are replaced
        seqs = [seq for seq, _, _ in active]
        budgets = [len(seq.draft_token_ids) for seq in seqs]
        width = max(budgets)
        rows = []
        for seq, b in zip(seqs, budgets):
            ref = reference[len(seq.output_token_ids):len(seq.output_token_ids) + b]
            row = [t if i < accept else (t + 1) % vocab for i, t in enumerate(ref)]
            rows += row + [0] * (width - len(row))
        drafts = to_device(rows, torch.int64, eng.device).view(len(seqs), width)
        p.pending = PendingDrafts(drafts, seqs, budgets)

    p._draft_greedy = forced


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-next-3b")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    a = ap.parse_args()
    plain = build(a.shape, a.device, None)
    plain.warmup()
    reference, plain_step, _ = run(plain, a.new)
    del plain
    print(f"{a.shape}: plain decode {plain_step * 1e3:.3f} ms/token")
    spec = SpeculativeConfig(algorithm="nextn", num_steps=a.k, adaptive=False)
    eng = build(a.shape, a.device, spec)
    eng.warmup()
    rows = {"plain_ms_per_token": plain_step * 1e3, "accepted": {}}
    for accept in range(a.k + 1):
        force_acceptance(eng, reference, accept)
        tokens, step, per_step = run(eng, a.new)
        assert tokens == reference, f"a={accept}: output differs from plain decoding"
        per_token = step / per_step
        rows["accepted"][accept] = dict(step_ms=step * 1e3, tokens_per_step=per_step,
                                        ms_per_token=per_token * 1e3,
                                        speedup=plain_step / per_token)
        print(f"  {accept} of {a.k} accepted: {step * 1e3:.3f} ms/step, {per_step:.2f} "
              f"tokens/step, {per_token * 1e3:.3f} ms/token, {plain_step / per_token:.2f}x "
              f"plain", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
