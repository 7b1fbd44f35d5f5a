"""Weight bytes a speculative step must read against a decode step, and the least time ratio
between them that those bytes allow (a roofline argument; no GPU needed).

    python benchmarks/verify_bytes.py [--shape qwen3-next-3b] [--k 3] [--decode-ms 1.197]
                                      [--token-map-size 32768] [--hbm-tb-s 4.8]
                                      [--target-ratio 1.15]

A decode step reads every weight of the target once (bf16, 2 bytes an element), the experts of
a MoE layer excepted: only the experts its token is routed to. A speculative step of k drafts
with an MTP layer reads at least

- the target over 1 + k tokens: the same dense weights once, but the experts of each MoE layer
  that *any* of the 1 + k tokens is routed to;
- k MTP passes of one row (its ``fc``, its decoder layer with its routed experts) and k draft
  heads (the target's LM head, or FR-Spec's over ``--token-map-size`` ids): each draft is the
  argmax of a head over the hidden state the draft before made, so they cannot share a read.

(Our engine's observe pass runs over all 1 + k verified rows, so it reads more; this counts the
least any MTP engine must read.) Recurrent state, KV cache and activations are left out, so the
bytes are a floor. Under routing uniform over the experts, independent between tokens (random
weights), the expected number of distinct experts among T tokens of top-k of E is
E (1 - (1 - k/E)^T) (:func:`expected_distinct`).

The ratio floor (:func:`ratio_floor`): the verify forward does all a decode step does, so at
the same quality of implementation it takes at least the decode step's ``D`` ms; the drafts
depend on it (the first on its acceptance, each on the one before), so they come after it and
take at least their bytes over the HBM bandwidth. The step thus takes at least
D + (draft bytes) / bandwidth, a ratio that only grows as D falls. The verify's extra experts
are not in it: a decode step that leaves HBM idle (ours uses 36% of it) leaves room to read
them alongside. So the floor is loose, and the bytes also say what a target ratio asks
(:func:`drafts_bandwidth_for`): the 4-token forward within D despite reading more, and the drafts
at a bandwidth. The H200's HBM3e peak is 4.8 TB/s (NVIDIA's H200 datasheet).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass

ELEMENT_BYTES = 2          # bf16
EXPERT_TENSORS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


def expected_distinct(experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts among ``tokens`` tokens, each routed to ``top_k`` of
    ``experts`` chosen uniformly without replacement, independently of the other tokens: an
    expert is missed by one token with probability 1 - top_k / experts."""
    if not 0 < top_k <= experts or tokens < 0:
        raise ValueError(f"need 0 < top_k <= experts and tokens >= 0, got {experts=} "
                         f"{top_k=} {tokens=}")
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


@dataclass
class WeightGroups:
    """Bytes of a checkpoint's weights by how a forward reads them (``ELEMENT_BYTES`` each).

    ``dense``: target tensors read whole by every forward (not the embedding, not experts);
    ``experts``: one expert of one target MoE layer, per layer (all layers alike), with
    ``moe_layers`` such layers; ``head``: the LM head [vocab, H]; ``row``: one embedding row;
    ``mtp_dense`` / ``mtp_moe_layers``: the same for the ``mtp.*`` tensors."""

    dense: int
    expert: int
    moe_layers: int
    head: int
    row: int
    mtp_dense: int
    mtp_moe_layers: int


def weight_groups(shapes: dict, num_experts: int) -> WeightGroups:
    """Group checkpoint tensors ``shapes`` (name -> shape, as ``checkpoint_shapes`` gives them;
    the head is ``lm_head.weight``, or the embedding when tied) by how a forward reads them.
    Raises ValueError when the MoE layers' experts differ in size."""
    dense = mtp_dense = 0
    experts: dict[str, int] = {}
    emb = shapes["model.embed_tokens.weight"]
    head = math.prod(shapes.get("lm_head.weight", emb)) * ELEMENT_BYTES
    for name, shape in shapes.items():
        b = math.prod(shape) * ELEMENT_BYTES
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            continue
        if name.endswith(EXPERT_TENSORS):
            layer = name[: -len(name.rsplit(".", 1)[1])]
            experts[layer] = experts.get(layer, 0) + b
        elif name.startswith("mtp."):
            mtp_dense += b
        else:
            dense += b
    sizes = set(experts.values())
    if len(sizes) > 1:
        raise ValueError(f"MoE layers of different sizes: {sorted(sizes)}")
    expert_layer = sizes.pop() if sizes else 0
    n_mtp = sum(k.startswith("mtp.") for k in experts)
    return WeightGroups(dense=dense, expert=expert_layer // num_experts,
                        moe_layers=len(experts) - n_mtp, head=head,
                        row=int(emb[1]) * ELEMENT_BYTES, mtp_dense=mtp_dense,
                        mtp_moe_layers=n_mtp)


@dataclass
class StepBytes:
    """Floors of the weight bytes of one batch-1 step (bytes)."""

    decode: float
    target_verify: float     # the target over 1 + k tokens
    drafts: float            # k MTP passes of one row and k draft heads
    step: float              # target_verify + drafts


def step_bytes(g: WeightGroups, num_experts: int, top_k: int, k: int,
               token_map_size: int | None = None) -> StepBytes:
    """The weight bytes of a decode step and of a speculative step of ``k`` MTP drafts (module
    doc), the draft heads over ``token_map_size`` ids when given (FR-Spec) else the full head."""
    def target(tokens: int) -> float:
        moe = g.moe_layers * g.expert * expected_distinct(num_experts, top_k, tokens)
        return g.dense + g.head + tokens * g.row + moe

    hidden = g.row // ELEMENT_BYTES
    draft_head = g.head if token_map_size is None else token_map_size * hidden * ELEMENT_BYTES
    mtp_pass = g.mtp_dense + g.row + g.mtp_moe_layers * g.expert * top_k
    drafts = k * (mtp_pass + draft_head)
    verify = target(1 + k)
    return StepBytes(decode=target(1), target_verify=verify, drafts=drafts, step=verify + drafts)


def ratio_floor(b: StepBytes, decode_ms: float, hbm_bytes_s: float) -> float:
    """The least (speculative step time) / (decode step time) when the decode step takes
    ``decode_ms``: 1 + (draft bytes / bandwidth) / decode time (module doc)."""
    return 1.0 + b.drafts / hbm_bytes_s / (decode_ms * 1e-3)


def drafts_bandwidth_for(b: StepBytes, decode_ms: float, ratio: float) -> float:
    """Bytes per second the drafts must stream at for the step to take ``ratio`` decode steps
    of ``decode_ms`` when the verify forward takes exactly one."""
    return b.drafts / ((ratio - 1.0) * decode_ms * 1e-3)


def report(shape: str, k: int, decode_ms: float, tb_s: float, token_map_size: int | None,
           target_ratio: float = 1.15):
    """The floors for one random-weight shape (bench/random_model.py), as a dict."""
    from mtpserve.bench.random_model import checkpoint_shapes, hf_config

    cfg = hf_config(shape)
    E, top_k = int(cfg.num_experts), int(cfg.num_experts_per_tok)
    g = weight_groups(checkpoint_shapes(cfg), E)
    bw = tb_s * 1e12
    out = {"shape": shape, "k": k, "decode_ms": decode_ms, "hbm_tb_s": tb_s,
           "groups": asdict(g), "distinct_experts": expected_distinct(E, top_k, 1 + k)}
    heads = [("full_head", None)]
    if token_map_size:
        heads.append((f"token_map_{token_map_size}", token_map_size))
    for label, size in heads:
        b = step_bytes(g, E, top_k, k, size)
        out[label] = {**{f"{n}_gb": v / 1e9 for n, v in asdict(b).items()},
                      "decode_at_peak_ms": b.decode / bw * 1e3,
                      "step_at_peak_ms": b.step / bw * 1e3,
                      "target_verify_over_decode_bytes": b.target_verify / b.decode,
                      "ratio_floor": ratio_floor(b, decode_ms, bw),
                      f"drafts_tb_s_for_{target_ratio}": drafts_bandwidth_for(
                          b, decode_ms, target_ratio) / 1e12}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-next-3b")
    ap.add_argument("--k", type=int, default=3, help="drafts a step")
    ap.add_argument("--decode-ms", type=float, default=1.197,
                    help="measured batch-1 decode step (ms); session 28 run 7's hybrid")
    ap.add_argument("--hbm-tb-s", type=float, default=4.8, help="HBM peak, TB/s")
    ap.add_argument("--token-map-size", type=int, default=32768,
                    help="FR-Spec draft head ids (0: full head only)")
    ap.add_argument("--target-ratio", type=float, default=1.15,
                    help="step / decode ratio whose draft bandwidth to report")
    ap.add_argument("--json", help="write the report here too")
    args = ap.parse_args()
    out = report(args.shape, args.k, args.decode_ms, args.hbm_tb_s, args.token_map_size or None,
                 args.target_ratio)
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
