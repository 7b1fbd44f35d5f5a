"""SmolLM2-135M-Instruct decode throughput on CPU: mtpserve next to HF transformers, one run.

Both engines load the same Q4_1 GGUF (dequantized to float32), generate exactly ``--new-tokens``
tokens greedily (EOS ignored) for 1 prompt and for 8 prompts at once, after one warm-up run each.
tok/s counts generated tokens over wall time, prefill included.

    python benchmarks/cpu_decode.py [--new-tokens 128] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

PROMPTS = [
    "Write a short story about a dragon who learns to bake bread.",
    "Explain how a hash map works, step by step.",
    "List five facts about the planet Mars.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Translate to French: The weather is nice today and we are going to the beach.",
    "What are the main causes of inflation?",
    "Write a haiku about autumn leaves.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
]


def bench_hf(path: str, n_new: int) -> dict[str, float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    kw = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=tok.pad_token_id)

    def run(prompts):
        enc = tok(prompts, return_tensors="pt", padding=True)
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, **kw)
        dt = time.perf_counter() - t
        assert out.shape[1] - enc.input_ids.shape[1] == n_new
        return len(prompts) * n_new / dt

    run(PROMPTS[:1])
    return {"batch1": run(PROMPTS[:1]), "batch8": run(PROMPTS)}


def bench_mtpserve(path: str, n_new: int) -> dict[str, float]:
    from mtpserve import LLM, SamplingParams

    llm = LLM(path, dtype="float32", device="cpu")
    params = SamplingParams(max_tokens=n_new, temperature=0.0, ignore_eos=True)

    def run(prompts):
        t = time.perf_counter()
        res = llm.generate(prompts, params)
        dt = time.perf_counter() - t
        assert all(len(r.outputs[0].token_ids) == n_new for r in res)
        return len(prompts) * n_new / dt

    run(PROMPTS[:1])
    return {"batch1": run(PROMPTS[:1]), "batch8": run(PROMPTS)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from mtpserve.loader import default_model_path

    path = default_model_path()
    ours = bench_mtpserve(path, a.new_tokens)
    hf = bench_hf(path, a.new_tokens)
    print(f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, {a.new_tokens} new tokens, float32")
    print(f"{'':10}{'mtpserve tok/s':>16}{'HF tok/s':>12}{'ratio':>8}")
    for k in ("batch1", "batch8"):
        print(f"{k:10}{ours[k]:16.1f}{hf[k]:12.1f}{ours[k] / hf[k]:8.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"mtpserve": ours, "hf": hf, "new_tokens": a.new_tokens,
                       "threads": torch.get_num_threads()}, f, indent=2)


if __name__ == "__main__":
    main()
