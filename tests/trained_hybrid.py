"""A tiny Qwen3-Next model trained together with its MTP layer on a predictable corpus, cached on
disk: the fixture that shows the MTP draft path is wired right (random MTP weights accept ~0).

Corpus: arithmetic progressions over the word ids 2..V-1, ``x_i = 2 + (a + i * d) mod (V - 2)``
with a random start a and a step d from ``STEPS``; the step is read off the context, so every
next token, and the next-next token that the MTP predicts, is determined by the first two. No EOS.

Training (float32, CPU, one thread, fixed seeds): HF's ``Qwen3NextForCausalLM`` plus an MTP head
built from HF modules of the same file (``Qwen3NextDecoderLayer`` with full attention, the
zero-centred ``Qwen3NextRMSNorm``, an ``nn.Linear`` fc), with the semantics of our inference
module (src/mtpserve/models/mtp.py): at position t the pair (h_t, x_{t+1}) gives
``y_t = norm(layer(fc(cat(norm_e(embed(x_{t+1})), norm_h(h_t)))))`` with RoPE position t and
causal attention over the MTP's own positions 0..t; ``lm_head(y_t)`` predicts x_{t+2} (teacher
forcing; h_t is the target's last hidden state after its final norm). Loss = next-token CE +
next-next-token CE (the MTP objective of DeepSeek-V3, sec. 2.2, with weight 1), Adam.

Cache: ``$MTPSERVE_CACHE_DIR/fixtures/trained-hybrid-<hash>/`` (default root ``~/.cache/mtpserve``),
``<hash>`` digesting the text of this file and of hybrid_checkpoint.py, the config, the training
settings and the torch / transformers versions; built in a temporary sibling directory and renamed
into place (other processes see all or none). Training takes ~70 s of CPU time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from harness_hybrid import MOE, SHAPE, one_thread
from hybrid_checkpoint import write_checkpoint

VOCAB = 64
SPAN = VOCAB - 2                 # progressions run over the ids 2..VOCAB-1
STEPS = (1, 2, 3)                # the common differences d
# 8 layers, three Gated DeltaNet then one full attention (Qwen3-Next's pattern): the adaptive
# policy prices an MTP step at 2 / num_hidden_layers decode steps, so 4 layers never pay to draft
CONFIG = {**SHAPE, **MOE, "vocab_size": VOCAB, "num_hidden_layers": 8,
          "full_attention_interval": 4, "mtp_num_hidden_layers": 1, "max_position_embeddings": 128}
TRAIN = dict(seed=0, steps=300, batch=16, seq_len=40, lr=3e-3, warmup=20)
MARKER = "trained-hybrid.json"


# ---- corpus ---------------------------------------------------------------------------------
def progression(start: int, d: int, length: int) -> list[int]:
    """Token ids ``2 + (start + i * d) mod SPAN`` for i < length."""
    return [2 + (start + i * d) % SPAN for i in range(length)]


def sample_batch(gen: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """[batch, length] int64 progressions with uniform random starts and steps."""
    starts = torch.randint(0, SPAN, (batch,), generator=gen).tolist()
    steps = torch.randint(0, len(STEPS), (batch,), generator=gen).tolist()
    return torch.tensor([progression(a, STEPS[s], length) for a, s in zip(starts, steps)])


def held_out_prompts(n: int, length: int, seed: int = 1234) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens drawn with their own seed (not the training stream);
    steps cycle through ``STEPS`` so every step is covered."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, SPAN, (n,), generator=gen).tolist()
    return [progression(a, STEPS[i % len(STEPS)], length) for i, a in enumerate(starts)]


# ---- the MTP head, from HF modules ---------------------------------------------------------
class HFMTPHead(nn.Module):
    """Training twin of our ``Qwen3NextMTP`` with the checkpoint's parameter names.

    ``forward(embed, next_ids [B, T] int64, hidden [B, T, H] float32, rotary) -> y [B, T, H]``
    float32 (after ``norm``): row t is the pair (h_t, x_{t+1}) at RoPE position t, attention
    causal over rows 0..t. ``embed`` and ``rotary`` are the target's ``nn.Embedding`` and
    ``Qwen3NextRotaryEmbedding`` (shared, as in the checkpoint format).
    """

    def __init__(self, config):
        from transformers.models.qwen3_next import modeling_qwen3_next as hf

        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        # HF picks the mixer from layer_types[idx]: take a full-attention index. Its FFN is MoE,
        # as every layer's in CONFIG, which is also what our module's layer-0 rule builds.
        full = config.layer_types.index("full_attention")
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = hf.Qwen3NextRMSNorm(H, eps)
        self.pre_fc_norm_hidden = hf.Qwen3NextRMSNorm(H, eps)
        self.layer = hf.Qwen3NextDecoderLayer(config, full)
        self.norm = hf.Qwen3NextRMSNorm(H, eps)

    def forward(self, embed: nn.Embedding, next_ids: torch.Tensor, hidden: torch.Tensor,
                rotary) -> torch.Tensor:
        e = self.pre_fc_norm_embedding(embed(next_ids))
        x = self.fc(torch.cat([e, self.pre_fc_norm_hidden(hidden)], dim=-1))
        T = x.shape[1]
        pos = torch.arange(T).unsqueeze(0)
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]   # additive, causal
        x = self.layer(x, position_embeddings=rotary(x, pos), attention_mask=mask,
                       position_ids=pos)
        return self.norm(x)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The ``mtp.*`` tensors our loader expects (layer as ``mtp.layers.0.<HF name>``)."""
        out = {}
        for name, t in self.state_dict().items():
            key = "layers.0." + name[len("layer."):] if name.startswith("layer.") else name
            out["mtp." + key] = t.detach().clone()
        return out


def forward_both(model, head: HFMTPHead, ids: torch.Tensor):
    """(next-token logits [B, T, V], MTP logits [B, T-1, V]; row t predicts x_{t+2})."""
    out = model.model(input_ids=ids)
    h = out.last_hidden_state                       # after the final norm
    y = head(model.model.embed_tokens, ids[:, 1:], h[:, :-1], model.model.rotary_emb)
    return model.lm_head(h), model.lm_head(y)


def losses(model, head: HFMTPHead, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(next-token CE, next-next-token CE over rows t = 0..T-3), float32 scalars."""
    logits, mtp_logits = forward_both(model, head, ids)
    V = logits.shape[-1]
    lm = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    mtp = F.cross_entropy(mtp_logits[:, :-1].reshape(-1, V), ids[:, 2:].reshape(-1))
    return lm, mtp


@torch.no_grad()
def accuracies(model, head: HFMTPHead, ids: torch.Tensor, skip: int = 2) -> tuple[float, float]:
    """Greedy (next-token, next-next-token) accuracy on ``ids`` [B, T], teacher forced, over
    positions t >= ``skip`` (the step d is unknowable before two tokens)."""
    logits, mtp_logits = forward_both(model, head, ids)
    lm = (logits[:, skip:-1].argmax(-1) == ids[:, skip + 1:]).float().mean().item()
    mtp = (mtp_logits[:, skip:-1].argmax(-1) == ids[:, skip + 2:]).float().mean().item()
    return lm, mtp


# ---- training -------------------------------------------------------------------------------
def build_models(seed: int):
    """A fresh float32 ``Qwen3NextForCausalLM`` of ``CONFIG`` (HF's init) and MTP head."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen3_next", **CONFIG)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    head = HFMTPHead(model.config)
    # HF leaves some parameters (router, fused experts) as torch.empty for the PreTrainedModel's
    # own init pass; the head is outside the model, so run that pass on it too (uninitialised
    # memory trained to NaN in a long test process)
    head.apply(model._init_weights)
    return model, head


def train(steps: int = TRAIN["steps"], log_every: int = 0):
    """Train model + MTP head jointly (Adam, linear warm-up, grad-norm clip 1) on fresh
    batches of ``TRAIN["batch"]`` x ``TRAIN["seq_len"]`` tokens; returns (model, head, stats:
    wall seconds, last losses in nats), both in eval mode."""
    p = TRAIN
    model, head = build_models(p["seed"])
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=p["lr"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / p["warmup"]))
    gen = torch.Generator().manual_seed(p["seed"])
    model.train(), head.train()
    t0 = time.perf_counter()
    for step in range(steps):
        lm, mtp = losses(model, head, sample_batch(gen, p["batch"], p["seq_len"]))
        opt.zero_grad()
        (lm + mtp).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if log_every and step % log_every == 0:
            print(f"step {step} lm {lm.item():.3f} mtp {mtp.item():.3f} "
                  f"{time.perf_counter() - t0:.1f}s", flush=True)
    model.eval(), head.eval()
    stats = {"train_seconds": round(time.perf_counter() - t0, 1), "final_lm_loss": lm.item(),
             "final_mtp_loss": mtp.item()}
    return model, head, stats


# ---- greedy speculative decoding replayed with the training modules -------------------------
@torch.no_grad()
def _target(model, ids: list[int]) -> tuple[torch.Tensor, list[int]]:
    """The target's final hidden states [L, H] over ``ids`` and its greedy token per position."""
    h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    return h, model.lm_head(h).argmax(-1).tolist()


@torch.no_grad()
def _mtp_drafts(model, head: HFMTPHead, ids: list[int], h: torch.Tensor, n: int) -> list[int]:
    """``n`` chained greedy MTP drafts after ``ids`` (L tokens; ``h`` [>= L-1, H] the target's
    hidden states): step 1 reads the pairs (h_t, x_{t+1}) at t = 0..L-2; step s + 1 appends
    (y of step s, draft s) at position L - 2 + s."""
    embed, rotary = model.model.embed_tokens, model.model.rotary_emb
    toks, hid, drafts = list(ids[1:]), h[: len(ids) - 1], []
    for _ in range(n):
        y = head(embed, torch.tensor([toks]), hid[None], rotary)[0, -1:]
        drafts.append(model.lm_head(y)[0].argmax().item())
        toks.append(drafts[-1])
        hid = torch.cat([hid, y])
    return drafts


def replay_spec(model, head: HFMTPHead, prompt: list[int], max_tokens: int, k: int,
                eos: int = 1) -> tuple[list[int], list[tuple[int, int]]]:
    """What our engine should do for one greedy request with MTP drafting (k steps, adaptive
    off, draft budget ``min(k, max_tokens - generated - 1)`` as ``Sequence.room_for_drafts``),
    recomputed without any cache with HF modules. Returns (generated token ids,
    [(drafts, accepted)] per verify step)."""
    ids = list(prompt)
    h, g = _target(model, ids)
    ids.append(g[-1])
    out, steps = [g[-1]], []
    while len(out) < max_tokens and out[-1] != eos:
        n = min(k, max_tokens - len(out) - 1)
        drafts = _mtp_drafts(model, head, ids, h, n)   # h covers positions 0..len(ids)-2
        h, g = _target(model, ids + drafts)
        greedy = g[len(ids) - 1:]
        a = 0
        while a < n and drafts[a] == greedy[a]:
            a += 1
        if n:
            steps.append((n, a))
        for t in greedy[: a + 1]:
            ids.append(t)
            out.append(t)
            if len(out) == max_tokens or t == eos:
                break
    return out, steps


# ---- export, cache ---------------------------------------------------------------------------
def cache_key() -> dict:
    """Everything the trained weights depend on: this file's and the checkpoint writer's text,
    the config, the training settings and the library versions."""
    import transformers

    here = Path(__file__).parent
    texts = "".join((here / f).read_text() for f in ("trained_hybrid.py", "hybrid_checkpoint.py"))
    return {"code": hashlib.sha256(texts.encode()).hexdigest(), "config": CONFIG,
            "train": TRAIN, "torch": torch.__version__, "transformers": transformers.__version__}


def cache_dir(key: dict) -> Path:
    """``<cache root>/fixtures/trained-hybrid-<16 hex digits of the key's sha256>``."""
    from mtpserve.loader.cache import cache_root

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "fixtures" / f"trained-hybrid-{digest}"


def build(path: Path) -> dict:
    """Train, write the checkpoint into ``path`` and return the training record (time, final
    losses, teacher-forced accuracies on held-out sequences)."""
    with one_thread():
        model, head, stats = train()
        held = sample_batch(torch.Generator().manual_seed(4321), 64, TRAIN["seq_len"])
        stats["heldout_next_token_acc"], stats["heldout_mtp_acc"] = accuracies(model, head, held)
    if not stats["heldout_next_token_acc"] >= 0.98:     # never cache a model that did not learn
        raise RuntimeError(f"the tiny hybrid did not learn the corpus: {stats}")
    write_checkpoint(path, model, head.checkpoint_tensors())
    return stats


def trained_hybrid_dir() -> Path:
    """The cached checkpoint directory (trained on first use; ~1 min on 2 CPU cores)."""
    key = cache_key()
    final = cache_dir(key)
    if (final / MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-" + final.name + "-", dir=final.parent))
    try:
        stats = build(tmp)
        (tmp / MARKER).write_text(json.dumps({"key": key, "stats": stats}, indent=1))
        os.rename(tmp, final)
    except OSError:
        if not (final / MARKER).is_file():   # not another process winning the rename
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_trained(path: Path):
    """(HF model, HFMTPHead) from a checkpoint directory, float32, eval mode."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    head = HFMTPHead(model.config)
    sd = {n[len("mtp."):]: t for n, t in load_file(str(path / "model.safetensors")).items()
          if n.startswith("mtp.")}
    sd = {("layer." + n[len("layers.0."):] if n.startswith("layers.0.") else n): t
          for n, t in sd.items()}
    head.load_state_dict(sd)
    return model, head.eval()
