"""n-gram speculation on CPU, SmolLM2-135M-Instruct (float32): speculation on vs off, one run.

For each prompt set (code-edit: the answer copies the prompt; chat: open-ended), every prompt is
run alone (batch 1), greedily, up to ``--max-tokens`` tokens, with speculation off and with n-gram
drafting at each k; HF transformers' greedy generate and its prompt lookup decoding run on the
same prompts for reference. Per-request tok/s = generated tokens / wall time, summed over the set.
Outputs are checked equal to the non-speculative ones.

    python benchmarks/cpu_spec.py [--max-tokens 128] [--k 3 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from mtpserve import LLM, SamplingParams
from mtpserve.bench.prompts import prompt_set
from mtpserve.loader import default_model_path

SETS = ("code-edit", "chat")


def chat_ids(tok, text):
    return list(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                        add_generation_prompt=True, return_dict=False))


def run_ours(llm, prompts, max_tokens):
    p = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    llm.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0.0))  # warm-up
    outs, t = [], time.perf_counter()
    for ids in prompts:
        outs.append(llm.generate([ids], p)[0].outputs[0])
    dt = time.perf_counter() - t
    n = sum(len(o.token_ids) for o in outs)
    steps = sum(o.spec.num_verify_steps for o in outs if o.spec)
    acc = sum(o.spec.num_accepted_tokens for o in outs if o.spec)
    return {"tok_s": n / dt, "tokens": n,
            "acceptance_length": (acc + steps) / steps if steps else None,
            "ids": [o.token_ids for o in outs]}


def run_hf(model, prompts, max_tokens, lookup):
    kw = dict(max_new_tokens=max_tokens, do_sample=False, pad_token_id=2)
    if lookup:
        kw["prompt_lookup_num_tokens"] = lookup
    n, t = 0, time.perf_counter()
    for ids in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), **kw)
        n += out.shape[1] - len(ids)
    return {"tok_s": n / (time.perf_counter() - t), "tokens": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--hf-lookup", type=int, default=10, help="HF prompt_lookup_num_tokens")
    ap.add_argument("--json")
    a = ap.parse_args()
    base = LLM(None, dtype="float32", max_model_len=2048, num_kv_blocks=512)
    spec = {k: LLM(None, dtype="float32", max_model_len=2048, num_kv_blocks=512,
                   speculative_algorithm="ngram", speculative_num_steps=k) for k in a.k}
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                              gguf_file=os.path.basename(path),
                                              dtype=torch.float32).eval()
    results = {}
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}, max {a.max_tokens} "
          f"tokens, batch 1, greedy")
    print(f"{'set':11}{'config':22}{'tok/s':>8}{'speedup':>9}{'acc.len':>9}")
    for name in SETS:
        prompts = [chat_ids(base.tokenizer, t) for t in prompt_set(name)]
        off = run_ours(base, prompts, a.max_tokens)
        rows = {"mtpserve spec off": off}
        for k, llm in spec.items():
            r = run_ours(llm, prompts, a.max_tokens)
            r["equal_to_off"] = r["ids"] == off["ids"]
            rows[f"mtpserve ngram k={k}"] = r
        rows["HF generate"] = run_hf(hf, prompts, a.max_tokens, 0)
        rows[f"HF lookup {a.hf_lookup}"] = run_hf(hf, prompts, a.max_tokens, a.hf_lookup)
        for cfg, r in rows.items():
            al = r.get("acceptance_length")
            eq = "" if "equal_to_off" not in r else ("  same output" if r["equal_to_off"]
                                                     else "  OUTPUT DIFFERS")
            print(f"{name:11}{cfg:22}{r['tok_s']:8.1f}{r['tok_s'] / off['tok_s']:9.2f}"
                  f"{al if al is None else round(al, 2)!s:>9}{eq}")
            r.pop("ids", None)
        results[name] = rows
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
