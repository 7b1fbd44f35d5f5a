"""Gated DeltaNet layer (linear attention with a recurrent state) of Qwen3-Next / Qwen3.5.

Per token (Yang et al. 2024, "Gated Delta Networks"; Qwen3-Next tech notes): project to q, k, v
(mixed, through a depthwise causal conv of kernel K with SiLU), a gate z, and per-value-head
``beta = sigmoid(b)`` and log decay ``g = -exp(A_log) * softplus(a + dt_bias)``; run the gated
delta rule (kernels/gated_delta_rule.py); normalise each head's output with a gated RMSNorm
(``rmsnorm(o) * w * silu(z)``); project out.

Projection layouts: Qwen3-Next's ``in_proj_qkvz`` groups [q | k | v | z] per key head and
``in_proj_ba`` groups [b | a] per key head; Qwen3.5 has flat ``in_proj_qkv`` [q | k | v],
``in_proj_z``, ``in_proj_b``, ``in_proj_a``. Both load into one column-parallel ``in_proj`` (one
matmul per step) in the flat order [q | k | v | z | b | a]: Qwen3-Next's grouped rows are
regrouped once at load (:func:`ungroup_qkvz`, :func:`ungroup_ba`), so that q, k, v come out of
the product side by side (the conv's input, a view) and z, b, a as views too, where the grouped
order needs a ``cat`` of q, k, v and a copy of z in every layer of every step. Under TP each rank
holds whole key-head groups.

State I/O follows engine/state_cache.py: each sequence starts from its slot's conv and SSM state
and leaves the state after its last token there; sequences with a scratch row also leave the
state after every query token in the scratch buffers (speculative verify). Sequences with at
most ``SMALL_QUERY`` tokens (decode, verify, short chunks) share one padded recurrent pass; longer
ones (prefill chunks) take the chunked form, all in one call (kernels/gated_delta_rule_varlen.py:
sequence by sequence, or one flash-linear-attention call). On CUDA the padded pass is two Triton
kernels (kernels/gated_delta_rule_triton.py) instead of dozens of small PyTorch ops, and
prefill chunks of up to ``MEDIUM_QUERY`` tokens take the same two kernels as a second padded
group: the chunked form issues ~100 small operations per sequence and layer (H200, session 12:
6108 matmuls and 1188 triangular solves for 64 prompts of 128 tokens, the device busy 0.78 s of a
2.77 s pass), while the recurrent kernels loop over the tokens in one launch for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from mtpserve.config import ModelConfig
from mtpserve.distributed import get_tp_rank, get_tp_size
from mtpserve.engine.forward_batch import ForwardBatch, to_device
from mtpserve.engine.state_cache import LinearAttnShape
from mtpserve.kernels.dispatch import use_triton
from mtpserve.kernels.gated_delta_rule import (causal_conv1d, chunk_gated_delta_rule,
                                               conv_states, recurrent_gated_delta_rule)
from mtpserve.kernels.gated_delta_rule_varlen import backend as gdn_prefill_backend
from mtpserve.kernels.gated_delta_rule_varlen import chunk_varlen, fla_chunk
from mtpserve.layers.linear import MergedColumnParallelLinear, RowParallelLinear

SMALL_QUERY = 16
# CUDA: prefill chunks of up to this many tokens run by the recurrent Triton kernels (one padded
# group), longer ones by the chunked form, whose work is parallel over chunks of 64 tokens.
MEDIUM_QUERY = 256
# off: at one token on CUDA the output norm runs in its own kernel, not inside the streamed
# out_proj (GatedDeltaNet._normed_output), for benchmarks/gpu_decode.py --compare
FUSED_OUT_NORM = True


def _load_sections(param: torch.Tensor, loaded: torch.Tensor, sizes: list[int]) -> None:
    """Copy this TP rank's slice of every section of ``loaded`` (sections of ``sizes`` rows,
    stacked along dim 0) into ``param``, sections kept in order."""
    rank, tp = get_tp_rank(), get_tp_size()
    src = dst = 0
    for n in sizes:
        part = n // tp
        param.data.narrow(0, dst, part).copy_(loaded.narrow(0, src + rank * part, part))
        src, dst = src + n, dst + part


class SectionedColumnParallelLinear(MergedColumnParallelLinear):
    """A merged column-parallel linear whose checkpoint tensors may hold several consecutive
    sections at once: ``shard_id`` is a section index or a tuple of them (Qwen3.5's fused
    ``in_proj_qkv`` fills the q, k and v sections)."""

    def weight_loader(self, param, loaded, shard_id=None):
        ids = shard_id if isinstance(shard_id, tuple) else (shard_id,)
        start = 0
        for i in ids:
            n = self.output_sizes[i]
            super().weight_loader(param, loaded.narrow(0, start, n), i)
            start += n


class ShortConv(nn.Module):
    """Depthwise conv weight [conv_dim_rank, K]; loads the checkpoint's [conv_dim, 1, K], whose
    channels are the [q | k | v] sections, each split over TP ranks."""

    def __init__(self, sections: list[int], kernel: int):
        super().__init__()
        self.sections = sections
        self.weight = nn.Parameter(torch.empty(sum(sections) // get_tp_size(), kernel),
                                   requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded, shard_id=None):
        _load_sections(param, loaded.reshape(loaded.shape[0], -1), self.sections)


def ungroup_qkvz(w: torch.Tensor, nk: int, dk: int, r: int, dv: int) -> torch.Tensor:
    """Qwen3-Next's ``in_proj_qkvz`` rows [nk * (2 dk + 2 r dv), ...], grouped per key head as
    [q (dk) | k (dk) | v (r dv) | z (r dv)], into the flat order [q | k | v | z] (each section
    head after head; value head ``h * r + j`` is key head h's j-th). Works on a weight
    [rows, H] or a bias [rows]; returns a new contiguous tensor."""
    q, k, v, z = w.view(nk, 2 * dk + 2 * r * dv, *w.shape[1:]).split([dk, dk, r * dv, r * dv], 1)
    return torch.cat([t.reshape(-1, *w.shape[1:]) for t in (q, k, v, z)])


def ungroup_ba(w: torch.Tensor, nk: int) -> torch.Tensor:
    """Qwen3-Next's ``in_proj_ba`` rows [2 nv, ...], grouped per key head as [b (r) | a (r)],
    into [b (nv) | a (nv)] (value head ``h * r + j`` is key head h's j-th)."""
    b, a = w.view(nk, 2, -1, *w.shape[1:]).unbind(1)
    return torch.cat([b.reshape(-1, *w.shape[1:]), a.reshape(-1, *w.shape[1:])])


class GatedRMSNorm(nn.Module):
    """``rmsnorm(x) * w * silu(z)`` over the last dim (w stored as is, not zero-centred);
    x, z [..., D] -> [..., D] in x's dtype, statistics in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3 and use_triton(x):   # one kernel (kernels/fused_triton.py)
            from mtpserve.kernels.fused_triton import gated_rms_norm

            return gated_rms_norm(x, z, self.weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h.to(x.dtype) * F.silu(z.float())).to(x.dtype)


@dataclass
class RecurrentPlan:
    """How a batch's sequences are run (built once per step, shared by all layers).

    The ``num_small`` sequences run by the recurrent form are padded into [Bs, max_q]:
    ``token_index`` [Ts] their flat token rows (None: all tokens, in order), ``pad_index`` [Ts]
    each token's row in the padded block (None: no padding), ``last`` [Bs] index of each one's
    last token, ``slots`` [Bs] their state slots, ``scratch`` (index in the group, scratch row,
    query length) for those that verify drafts. ``large``: (start, end, slot) of each sequence
    run by the chunked form. CUDA graphs (engine/hybrid_graph.py) use device tensors instead of
    host lists: ``scratch_rows`` [Bs] int64, every sequence writes its per-token states to that
    scratch row (``scratch`` is then empty); ``token_mask`` [Bs * max_q] (1 real token, 0 padding
    inside the padded block): padding gets ``g = beta = 0``, which leaves the SSM state unchanged,
    and ``last`` points at each sequence's last real token. ``kernel_rows`` [Bs] int64: the Triton
    path's form of ``scratch`` (each sequence's scratch row, -1 for none), built on first use.
    """

    token_index: torch.Tensor | None
    pad_index: torch.Tensor | None
    num_small: int
    max_q: int
    last: torch.Tensor | None
    slots: torch.Tensor | None
    scratch: list[tuple[int, int, int]]
    large: list[tuple[int, int, int]]
    scratch_rows: torch.Tensor | None = None
    token_mask: torch.Tensor | None = None
    kernel_rows: torch.Tensor | None = None
    medium: list[RecurrentPlan] = field(default_factory=list)


def _plan(batch: ForwardBatch) -> RecurrentPlan:
    if "gdn_plan" in batch.extra:
        return batch.extra["gdn_plan"]
    meta, qlens, dev = batch.extra["linear_attn"], batch.query_lens_cpu, batch.input_ids.device
    starts = [0]
    for q in qlens:
        starts.append(starts[-1] + q)
    is_small = [q <= SMALL_QUERY or r >= 0 for q, r in zip(qlens, meta.scratch_rows)]
    small = [b for b, yes in enumerate(is_small) if yes]
    longer = [b for b, yes in enumerate(is_small) if not yes]
    medium: dict[int, list[int]] = {}   # power-of-two length bucket -> its sequences
    if longer and use_triton(batch.input_ids):
        for b in longer:
            if qlens[b] <= MEDIUM_QUERY:
                medium.setdefault((qlens[b] - 1).bit_length(), []).append(b)
    grouped = {b for seqs in medium.values() for b in seqs}
    plan = _group(small, qlens, starts, meta, dev)
    plan.large = [(starts[b], starts[b + 1], meta.slots_cpu[b]) for b in longer
                  if b not in grouped]
    plan.medium = [_group(seqs, qlens, starts, meta, dev) for _, seqs in sorted(medium.items())]
    batch.extra["gdn_plan"] = plan
    return plan


def _group(seqs: list[int], qlens: list[int], starts: list[int], meta,
           dev: torch.device) -> RecurrentPlan:
    """The padded group of the batch's sequences ``seqs`` (indices, in order), its ``large``
    empty: their tokens' rows, padding, last tokens, state slots and scratch rows."""
    sq = [qlens[b] for b in seqs]
    max_q = max(sq, default=0)

    def i64(values):
        return to_device(values, torch.int64, dev)

    return RecurrentPlan(
        token_index=None if len(seqs) == len(qlens) else i64(
            [starts[b] + i for b in seqs for i in range(qlens[b])]),
        pad_index=None if all(q == max_q for q in sq) else i64(
            [g * max_q + i for g, q in enumerate(sq) for i in range(q)]),
        num_small=len(seqs), max_q=max_q,
        last=i64([q - 1 for q in sq]) if seqs else None,
        slots=i64([meta.slots_cpu[b] for b in seqs]) if seqs else None,
        scratch=[(g, meta.scratch_rows[b], qlens[b]) for g, b in enumerate(seqs)
                 if meta.scratch_rows[b] >= 0],
        large=[])


def _pad(x: torch.Tensor, p: RecurrentPlan) -> torch.Tensor:
    """Rows of the small group [Ts, ...] -> zero-padded [Bs, max_q, ...]."""
    x = x if p.token_index is None else x[p.token_index]
    if p.pad_index is not None:
        full = x.new_zeros(p.num_small * p.max_q, *x.shape[1:])
        full[p.pad_index] = x
        x = full
    return x.view(p.num_small, p.max_q, *x.shape[1:])


def _unpad(x: torch.Tensor, p: RecurrentPlan) -> torch.Tensor:
    x = x.flatten(0, 1)
    return x if p.pad_index is None else x[p.pad_index]


def _kernel_rows(p: RecurrentPlan) -> torch.Tensor | None:
    """Each small sequence's scratch row [Bs] int64 (-1: none), or None when none verifies."""
    if p.scratch_rows is not None or not p.scratch:
        return p.scratch_rows
    if p.kernel_rows is None:
        rows = [-1] * p.num_small
        for i, row, _ in p.scratch:
            rows[i] = row
        p.kernel_rows = to_device(rows, torch.int64, p.slots.device)
    return p.kernel_rows


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet token mixer: ``forward(x [T, H], batch) -> [T, H]``.

    ``state_idx`` indexes this layer's tensors in the StateCache (0..n_linear-1) and
    ``state_shape`` gives their sizes on this rank (conv_dim = 2 * key_dim + value_dim).

    Raises:
        ValueError: when the head counts do not divide over the TP ranks, or
            ``MTPSERVE_GDN_PREFILL`` names no backend.
        ImportError: ``MTPSERVE_GDN_PREFILL=fla`` without fla-core installed.
    """

    def __init__(self, cfg: ModelConfig, state_idx: int):
        super().__init__()
        if gdn_prefill_backend() == "fla":   # at start, not at the first prefill
            fla_chunk()
        hf, tp = cfg.hf_config, get_tp_size()
        nk, nv = hf.linear_num_key_heads, hf.linear_num_value_heads
        if nk % tp or nv % nk:
            raise ValueError(f"linear attention heads {nk}/{nv} do not split over TP {tp}")
        self.hk, self.hv = nk // tp, nv // tp
        self.dk, self.dv = hf.linear_key_head_dim, hf.linear_value_head_dim
        self.kernel = hf.linear_conv_kernel_dim
        key_dim, value_dim = nk * self.dk, nv * self.dv
        self.in_proj = SectionedColumnParallelLinear(
            cfg.hidden_size, [key_dim, key_dim, value_dim, value_dim, nv, nv])
        self.in_proj.weight.weight_loader = self._load_in_proj
        self.conv1d = ShortConv([key_dim, key_dim, value_dim], self.kernel)
        self.A_log = nn.Parameter(torch.empty(self.hv), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.empty(self.hv), requires_grad=False)
        for p in (self.A_log, self.dt_bias):
            p.weight_loader = self._load_heads
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = RowParallelLinear(value_dim, cfg.hidden_size)
        self.state_idx = state_idx
        self.state_shape = LinearAttnShape(2 * self.hk * self.dk + self.hv * self.dv, self.kernel,
                                           self.hv, self.dk, self.dv)

    def _load_heads(self, param, loaded, shard_id=None):
        param.data.copy_(loaded.narrow(0, get_tp_rank() * self.hv, self.hv))

    def _load_in_proj(self, param, loaded, shard_id=None):
        """``in_proj``'s loader: Qwen3-Next's grouped ``in_proj_qkvz`` (``shard_id`` "qkvz") and
        ``in_proj_ba`` ("ba"), whole checkpoint tensors, go in as the flat sections they hold;
        Qwen3.5's flat tensors (section indices) as they are."""
        if shard_id == "qkvz":
            shard_id, loaded = (0, 1, 2, 3), ungroup_qkvz(loaded, self.hk * get_tp_size(),
                                                          self.dk, self.hv // self.hk, self.dv)
        elif shard_id == "ba":
            shard_id, loaded = (4, 5), ungroup_ba(loaded, self.hk * get_tp_size())
        self.in_proj.weight_loader(param, loaded, shard_id)

    def _split(self, proj: torch.Tensor):
        """in_proj output [T, 2 Hk Dk + 2 Hv Dv + 2 Hv] -> mixed qkv [T, conv_dim], z [T, Hv, Dv],
        b, a [T, Hk, Hv / Hk] (views; value head ``h`` at ``[:, h // r, h % r]``)."""
        T, r = proj.shape[0], self.hv // self.hk
        kd, vd = self.hk * self.dk, self.hv * self.dv
        mixed, z, b, a = proj.split([2 * kd + vd, vd, self.hv, self.hv], dim=-1)
        return (mixed, z.view(T, self.hv, self.dv), b.unflatten(-1, (self.hk, r)),
                a.unflatten(-1, (self.hk, r)))

    def _gates(self, b, a, plan: RecurrentPlan):
        """b, a [T, Hk, Hv / Hk] -> beta, g [T, Hv] float32 (zero on a graph block's padding)."""
        beta = torch.sigmoid(b.reshape(b.shape[0], -1).float())
        a = a.reshape(a.shape[0], -1)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        if plan.token_mask is not None:
            beta, g = beta * plan.token_mask[:, None], g * plan.token_mask[:, None]
        return beta, g

    def _heads(self, x: torch.Tensor):
        """Conv output [..., conv_dim] -> q, k [..., Hk, Dk], v [..., Hv, Dv]."""
        kd = self.hk * self.dk
        q, k, v = x.split([kd, kd, self.hv * self.dv], dim=-1)
        return (q.unflatten(-1, (self.hk, self.dk)), k.unflatten(-1, (self.hk, self.dk)),
                v.unflatten(-1, (self.hv, self.dv)))

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        mixed, z, b, a = self._split(self.in_proj(x))
        plan, cache = _plan(batch), batch.extra["linear_attn"].cache
        core = x.new_empty(x.shape[0], self.hv, self.dv)
        fused = plan.num_small > 0 and use_triton(mixed)
        if fused:
            self._run_small_triton(plan, mixed, b, a, core, cache)
        for group in plan.medium:   # built only where the Triton kernels run (CUDA)
            self._run_small_triton(group, mixed, b, a, core, cache)
        if plan.large or (plan.num_small and not fused):
            beta, g = self._gates(b, a, plan)
            if not fused and plan.num_small:
                self._run_small(plan, mixed, g, beta, core, cache)
            if plan.large and gdn_prefill_backend() == "fla":
                self._run_large_packed(plan.large, mixed, g, beta, core, cache)
            else:
                for start, end, slot in plan.large:
                    self._run_chunked(start, end, slot, mixed, g, beta, core, cache)
        return self.out_proj(self._normed_output(core, z))

    def _normed_output(self, core: torch.Tensor, z: torch.Tensor):
        """out_proj's input: the gated norm of ``core`` [T, Hv, Dv] by ``z`` [T, Hv, Dv], as
        [T, Hv Dv]; at one token on CUDA, where the streamed out_proj takes it in its own
        programs (FUSED_OUT_NORM, ``gemv_triton.gated_norm_fits``), the norm still to be done
        (``GatedNormInput``): one kernel and its boundary fewer a decode step's layer."""
        T = core.shape[0]
        if FUSED_OUT_NORM and T == 1 and use_triton(core) and z.is_contiguous():
            from mtpserve.kernels.gemv_stream_triton import GatedNormInput
            from mtpserve.kernels.gemv_triton import gated_norm_fits

            flat = core.view(1, -1)
            if gated_norm_fits(flat, self.out_proj.weight, self.dv):
                return GatedNormInput(flat, z.view(1, -1), self.norm.weight, self.norm.eps)
        return self.norm(core, z).reshape(T, -1)

    def _run_small(self, p: RecurrentPlan, mixed, g, beta, core, cache) -> None:
        conv_c, ssm_c = cache.conv[self.state_idx], cache.ssm[self.state_idx]
        out, window = causal_conv1d(_pad(mixed, p), conv_c[p.slots], self.conv1d.weight)
        conv_after = conv_states(window, self.kernel)               # [Bs, max_q, C, K-1]
        rows = torch.arange(p.num_small, device=mixed.device)
        conv_c.index_copy_(0, p.slots, conv_after[rows, p.last].to(conv_c.dtype))
        q, k, v = self._heads(out)
        keep = bool(p.scratch) or p.scratch_rows is not None
        o, final, per_token = recurrent_gated_delta_rule(
            q, k, v, _pad(g, p), _pad(beta, p), ssm_c[p.slots], keep_states=keep)
        ssm_c.index_copy_(0, p.slots, final.to(ssm_c.dtype))
        conv_s, ssm_s = cache.conv_scratch[self.state_idx], cache.ssm_scratch[self.state_idx]
        for i, row, n in p.scratch:
            conv_s[row, :n] = conv_after[i, :n]
            ssm_s[row, :n] = per_token[i, :n]
        if p.scratch_rows is not None:
            conv_s[:, :p.max_q].index_copy_(0, p.scratch_rows, conv_after.to(conv_s.dtype))
            ssm_s[:, :p.max_q].index_copy_(0, p.scratch_rows, per_token.to(ssm_s.dtype))
        rows = slice(None) if p.token_index is None else p.token_index
        core[rows] = _unpad(o, p).to(core.dtype)

    def _run_small_triton(self, p: RecurrentPlan, mixed, b, a, core, cache) -> None:
        """:meth:`_run_small` on CUDA in two kernels (conv, then the delta rule with the gates
        folded in); padding is told apart by ``p.last`` rather than by zeroed gates."""
        from mtpserve.kernels import gated_delta_rule_triton as gdn

        i, rows = self.state_idx, _kernel_rows(p)
        scratch = rows is not None
        out = gdn.fused_causal_conv1d(_pad(mixed, p), self.conv1d.weight, cache.conv[i], p.slots,
                                      p.last, cache.conv_scratch[i] if scratch else None, rows)
        q, k, v = self._heads(out)
        direct = p.token_index is None and p.pad_index is None
        o = core.view(v.shape) if direct else v.new_empty(v.shape)
        gdn.fused_recurrent_gated_delta_rule(
            q, k, v, _pad(a, p), _pad(b, p), cache.ssm[i], p.slots, o, last=p.last,
            scratch=cache.ssm_scratch[i] if scratch else None, scratch_rows=rows,
            gate_params=(self.A_log, self.dt_bias))
        if not direct:
            core[slice(None) if p.token_index is None else p.token_index] = _unpad(o, p)

    def _conv(self, start, end, slot, mixed, cache) -> torch.Tensor:
        """The causal conv of one long sequence's tokens ``start .. end - 1`` from its slot's
        conv state, which it then replaces: [end - start, conv_dim]."""
        conv_c = cache.conv[self.state_idx]
        out, window = causal_conv1d(mixed[None, start:end], conv_c[slot][None],
                                    self.conv1d.weight)
        conv_c[slot] = window[0, -(self.kernel - 1):].transpose(0, 1)
        return out[0]

    def _run_chunked(self, start, end, slot, mixed, g, beta, core, cache) -> None:
        """The chunked form over one long sequence (tokens ``start .. end - 1``, state
        ``slot``): its states are read and written in place, no copy of all of a step's."""
        ssm_c = cache.ssm[self.state_idx]
        q, k, v = self._heads(self._conv(start, end, slot, mixed, cache))
        o, final = chunk_gated_delta_rule(q, k, v, g[start:end], beta[start:end], ssm_c[slot])
        ssm_c[slot] = final
        core[start:end] = o.to(core.dtype)

    def _run_large_packed(self, large, mixed, g, beta, core, cache) -> None:
        """The chunked form over ``large`` ((start, end, slot) of each long sequence) with
        ``MTPSERVE_GDN_PREFILL=fla``: the causal conv sequence by sequence, then the gated delta
        rule for all of them in one call (kernels/gated_delta_rule_varlen.py). Takes a copy of
        every sequence's SSM state, twice (in and out): [N, Hv, Dk, Dv] float32 each, which the
        memory profile's single-sequence prefill does not see."""
        ssm_c = cache.ssm[self.state_idx]
        outs = [self._conv(start, end, slot, mixed, cache) for start, end, slot in large]
        q, k, v = self._heads(torch.cat(outs) if len(outs) > 1 else outs[0])
        rows = [i for start, end, _ in large for i in range(start, end)]
        span = (slice(rows[0], rows[0] + len(rows))
                if rows == list(range(rows[0], rows[0] + len(rows)))
                else to_device(rows, torch.int64, core.device))
        slots = to_device([slot for _, _, slot in large], torch.int64, ssm_c.device)
        o, final = chunk_varlen(q, k, v, g[span], beta[span], ssm_c[slots],
                                [end - start for start, end, _ in large])
        ssm_c[slots] = final.to(ssm_c.dtype)
        core[span] = o.to(core.dtype)
