"""n-gram speculation on the GPU with the real SmolLM2-135M-Instruct (bf16): on vs off, one run.

The code-edit and chat prompt sets, greedy, up to ``--max-tokens`` tokens: at concurrency 1
(prompts one after another) and at concurrency 64 (64 requests at once, cycling the set).
Per-request tok/s = a request's tokens / its own wall time (at c=64: the batch's wall time);
total tok/s = all tokens / wall time. Outputs are compared with the non-speculative ones.

    python benchmarks/gpu_spec.py [--max-tokens 256] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

from mtpserve import LLM, SamplingParams
from mtpserve.bench.prompts import prompt_set


def chat_ids(tok, text):
    return list(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                        add_generation_prompt=True, return_dict=False))


def run(llm, prompts, conc, max_tokens):
    p = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    if conc == 1:
        outs, per, t0 = [], [], time.perf_counter()
        for ids in prompts:
            t = time.perf_counter()
            o = llm.generate([ids], p)[0].outputs[0]
            per.append(len(o.token_ids) / (time.perf_counter() - t))
            outs.append(o)
        wall = time.perf_counter() - t0
        per_req = sum(per) / len(per)
    else:
        batch = [prompts[i % len(prompts)] for i in range(conc)]
        t0 = time.perf_counter()
        outs = [r.outputs[0] for r in llm.generate(batch, p)]
        wall = time.perf_counter() - t0
        per_req = sum(len(o.token_ids) for o in outs) / len(outs) / wall
    n = sum(len(o.token_ids) for o in outs)
    steps = sum(o.spec.num_verify_steps for o in outs if o.spec)
    acc = sum(o.spec.num_accepted_tokens for o in outs if o.spec)
    return {"per_request_tok_s": per_req, "total_tok_s": n / wall,
            "acceptance_length": (acc + steps) / steps if steps else None,
            "ids": [o.token_ids for o in outs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--json")
    a = ap.parse_args()
    kw = dict(dtype="bfloat16", max_model_len=2048, max_num_seqs=64, gpu_memory_utilization=0.4)
    engines = {"off": LLM(None, **kw),
               f"ngram k={a.k}": LLM(None, speculative_algorithm="ngram",
                                     speculative_num_steps=a.k, **kw)}
    results = {}
    print(f"{'set':11}{'conc':>5} {'config':14}{'req tok/s':>10}{'total tok/s':>12}"
          f"{'speedup':>9}{'acc.len':>8}  same")
    for name in ("code-edit", "chat"):
        prompts = [chat_ids(engines["off"].tokenizer, t) for t in prompt_set(name)]
        for conc in (1, 64):
            base = None
            for label, llm in engines.items():
                llm.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0.0))
                r = run(llm, prompts, conc, a.max_tokens)
                ids = r.pop("ids")
                base = base or {**r, "ids": ids}
                same = ids == base["ids"]
                al = r["acceptance_length"]
                print(f"{name:11}{conc:5} {label:14}{r['per_request_tok_s']:10.1f}"
                      f"{r['total_tok_s']:12.0f}{r['per_request_tok_s'] / base['per_request_tok_s']:9.2f}"
                      f"{'' if al is None else f'{al:.2f}':>8}  {same}")
                r["same_as_off"] = same
                results[f"{name}/c{conc}/{label}"] = r
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
