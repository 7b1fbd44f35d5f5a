"""n-gram speculation on the GPU with the real SmolLM2-135M-Instruct (bf16): on vs off.

The code-edit and chat prompt sets, greedy, up to ``--max-tokens`` tokens: at concurrency 1
(prompts one after another) and at concurrency 64 (64 requests at once, cycling the set).
Per-request tok/s = a request's tokens / its own wall time (at c=64: the batch's wall time); total
tok/s = all tokens / wall time; decode tok/s = the mean over requests of each one's tokens after its
first over the time from its first delta to its last (at c=1, per-request tok/s: the speedup a user
of that load sees, queueing and prefill apart). ``--requests 256`` at c=64 submits 256 requests to
the engine of 64 sequences: a continuous load, as a server at 64 concurrent requests sees, instead
of one batch of 64 whose stragglers finish alone (n-gram finishes some requests early, and the rest
then decode at a smaller, less efficient batch). Outputs are compared with the non-speculative ones.

After each row, the n-gram engine's load gate (spec/load_gate.py): its tokens/s figures of
drafting and plain steps per batch-size bucket, as they stand after the measured rounds, and
what it was told in the measured rounds (``gate_log``): per bucket and arm, the steps recorded,
their tokens and seconds (switches apart), so the figures can be checked against what the
steps really yielded.

Each (set, concurrency) first runs the whole load once per engine unmeasured (GPU clocks ramp up,
Triton and cuBLAS settle), then ``--repeats`` measured rounds alternating off and on, so a drift
of the machine hits both; the table gives medians and the speedup's range over the rounds.

    python benchmarks/gpu_spec.py [--max-tokens 256] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

from mtpserve import LLM, SamplingParams
from mtpserve.bench.prompts import prompt_set


def chat_ids(tok, text):
    return list(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                        add_generation_prompt=True, return_dict=False))


def run(llm, prompts, conc, max_tokens, requests=None):
    """One load: at ``conc`` 1 the prompts one after another; else ``requests`` requests
    (default ``conc``) cycling the prompts, submitted at once to an engine that runs
    ``max_num_seqs`` of them together (64 here: past that, a continuous load)."""
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
        decode = per
    else:
        batch = [prompts[i % len(prompts)] for i in range(requests or conc)]
        t0 = time.perf_counter()
        with delta_clock(llm) as seen:
            outs = [r.outputs[0] for r in llm.generate(batch, p)]
        wall = time.perf_counter() - t0
        per_req = sum(len(o.token_ids) for o in outs) / len(outs) / wall
        decode = decode_rates(seen)
    n = sum(len(o.token_ids) for o in outs)
    steps = sum(o.spec.num_verify_steps for o in outs if o.spec)
    acc = sum(o.spec.num_accepted_tokens for o in outs if o.spec)
    return {"per_request_tok_s": per_req, "total_tok_s": n / wall,
            "decode_tok_s": sum(decode) / len(decode) if decode else None,
            "acceptance_length": (acc + steps) / steps if steps else None,
            "ids": [o.token_ids for o in outs]}


@contextlib.contextmanager
def wrapped(obj, name: str, hook):
    """While entered, ``obj.name(*a, **k)`` calls ``hook(original, *a, **k)``; the class's
    method after."""
    original = getattr(obj, name)
    setattr(obj, name, lambda *a, **k: hook(original, *a, **k))
    try:
        yield
    finally:
        delattr(obj, name)


@contextlib.contextmanager
def delta_clock(llm):
    """While entered, times each request's deltas as ``llm``'s engine returns them; yields a
    dict filled per request id with (when its first tokens came, its last, how many it had)."""
    seen = {}

    def timed(step):
        outs = step()
        now = time.perf_counter()
        for o in outs:
            if o.new_token_ids:
                seen[o.request_id] = (seen.get(o.request_id, (now,))[0], now,
                                      o.num_output_tokens)
        return outs
    with wrapped(llm.engine, "step", timed):
        yield seen


def decode_rates(seen: dict) -> list[float]:
    """Per request of :func:`delta_clock`'s dict: tokens after its first over the seconds from
    its first delta to its last (its own decode speed, queueing and prefill apart)."""
    return [(n - 1) / (last - first) for first, last, n in seen.values()
            if n > 1 and last > first]


def gate_of(llm):
    """``llm``'s load gate (spec/load_gate.py), None without one."""
    return getattr(getattr(llm.engine.proposer, "policy", None), "gate", None)


def gate_figures(llm) -> dict:
    """The load gate's figures of ``llm``'s proposer, per batch-size bucket: tokens/s of
    drafting and plain steps, steps recorded of each, steps seen; {} without a gate."""
    gate = gate_of(llm)
    if gate is None:
        return {}
    return {f"<= {2 ** k}": {"draft_tok_s": b.rate.get(True), "plain_tok_s": b.rate.get(False),
                             "draft_steps": b.count.get(True, 0),
                             "plain_steps": b.count.get(False, 0), "steps": b.steps}
            for k, b in sorted(gate._buckets.items())}


@contextlib.contextmanager
def gate_log(llm):
    """While entered, sums what ``llm``'s load gate is told (its ``record``: the engine's report
    of each decode step) per (bucket, arm, switch); yields a dict of those sums: per key, steps,
    tokens, seconds (stays empty without a gate)."""
    sums, gate = {}, gate_of(llm)
    if gate is None:
        yield sums
        return

    def logged(record, num_seqs, drafted, tokens, seconds, switch=False):
        key = f"<= {2 ** gate.bucket(num_seqs)} {'draft' if drafted else 'plain'}" + (
            " switch" if drafted and switch else "")
        row = sums.setdefault(key, [0, 0, 0.0])
        row[0] += 1
        row[1] += tokens
        row[2] += seconds
        return record(num_seqs, drafted, tokens, seconds, switch)
    with wrapped(gate, "record", logged):
        yield sums


def log_table(sums: dict) -> dict:
    """:func:`gate_log`'s sums per key: steps, tokens, seconds and their tokens/s."""
    return {k: {"steps": n, "tokens": t, "seconds": s, "tok_s": t / s if s else None}
            for k, (n, t, s) in sorted(sums.items())}


def median(xs):
    return sorted(xs)[len(xs) // 2]


def compare(engines, prompts, conc, max_tokens, repeats, requests=None):
    """Warm-up, then ``repeats`` alternating rounds; per engine label: the median run's
    figures, plus the speedups of every round (on / off, per-request tok/s)."""
    for llm in engines.values():
        run(llm, prompts, conc, max_tokens, requests)
    with contextlib.ExitStack() as stack:
        logs = {label: stack.enter_context(gate_log(llm)) for label, llm in engines.items()}
        rounds = [{label: run(llm, prompts, conc, max_tokens, requests)
                   for label, llm in engines.items()} for _ in range(repeats)]
    base_ids = rounds[0]["off"]["ids"]
    out = {}
    for label in engines:
        runs = sorted((r[label] for r in rounds), key=lambda r: r["per_request_tok_s"])
        mid = dict(runs[len(runs) // 2])
        mid["same_as_off"] = all(r[label]["ids"] == base_ids for r in rounds)
        mid["speedups"] = [r[label]["per_request_tok_s"] / r["off"]["per_request_tok_s"]
                           for r in rounds]
        mid["decode_speedups"] = [r[label]["decode_tok_s"] / r["off"]["decode_tok_s"]
                                  for r in rounds]
        mid.pop("ids")
        mid["gate"] = gate_figures(engines[label])
        mid["gate_log"] = log_table(logs[label])
        out[label] = mid
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", default="1,64", help="comma-separated levels")
    ap.add_argument("--sets", default="code-edit,chat")
    ap.add_argument("--requests", type=int,
                    help="requests per load at concurrency > 1 (default: the concurrency, one "
                         "closed batch whose stragglers run alone at the end; more than 64 "
                         "keeps 64 running until the last are admitted)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json")
    a = ap.parse_args()
    kw = dict(dtype=a.dtype, max_model_len=2048, max_num_seqs=64, gpu_memory_utilization=0.4)
    engines = {"off": LLM(None, **kw),
               f"ngram k={a.k}": LLM(None, speculative_algorithm="ngram",
                                     speculative_num_steps=a.k, **kw)}
    results = {}
    print(f"{'set':11}{'conc':>5} {'config':14}{'req tok/s':>10}{'total tok/s':>12}"
          f"{'speedup':>9}{'range':>12}{'decode x':>9}{'acc.len':>8}  same")
    for name in a.sets.split(","):
        prompts = [chat_ids(engines["off"].tokenizer, t) for t in prompt_set(name)]
        for conc in (int(c) for c in a.concurrency.split(",")):
            res = compare(engines, prompts, conc, a.max_tokens, a.repeats,
                          a.requests if conc > 1 else None)
            for label, r in res.items():
                sp, al = r["speedups"], r["acceptance_length"]
                print(f"{name:11}{conc:5} {label:14}{r['per_request_tok_s']:10.1f}"
                      f"{r['total_tok_s']:12.0f}{median(sp):9.2f}"
                      f"{f'{min(sp):.2f}-{max(sp):.2f}':>12}"
                      f"{median(r['decode_speedups']):9.2f}"
                      f"{'' if al is None else f'{al:.2f}':>8}  {r['same_as_off']}")
                results[f"{name}/c{conc}/{label}"] = r
                for bucket, g in r["gate"].items():
                    print(f"    gate {bucket:>6}: draft {g['draft_tok_s'] or 0:8.0f} tok/s "
                          f"({g['draft_steps']} steps), plain {g['plain_tok_s'] or 0:8.0f} "
                          f"tok/s ({g['plain_steps']}), {g['steps']} steps")
                for key, g in r["gate_log"].items():
                    print(f"    told {key:>20}: {g['steps']:6d} steps {g['tokens']:7d} tokens "
                          f"{g['seconds']:8.3f} s {g['tok_s'] or 0:8.0f} tok/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
