"""Recurrent state of linear-attention (Gated DeltaNet) layers: one slot per running request.

Per linear-attention layer i:
- ``conv[i]``: [num_slots, conv_dim, kernel - 1] in the model dtype: the last ``kernel - 1``
  inputs of the short causal convolution (the conv window);
- ``ssm[i]``: [num_slots, num_v_heads, head_k_dim, head_v_dim] in ``ssm_dtype`` (float32 by
  default): the delta-rule state S (keys x values).

Speculative verify uses *snapshot + scatter* (DESIGN.md): a layer always writes the state after a
sequence's last query token into its slot, and for sequences that verify drafts it also writes the
state after *each* query token into ``conv_scratch[i]`` / ``ssm_scratch[i]`` ([rows, k + 1, ...]).
After accepting j of k drafts, :meth:`StateCache.commit` copies position j's state into the slot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from mtpserve.engine.forward_batch import to_device
from mtpserve.kernels.dispatch import use_triton

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinearAttnShape:
    """Sizes of one Gated DeltaNet layer's state (all layers of a model share them)."""

    conv_dim: int
    kernel: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int


class StateCache:
    """Slots of conv and SSM state for ``num_layers`` linear-attention layers.

    Args:
        num_slots: most requests holding state at once; max_drafts: k (0: no speculation);
        scratch_rows: most sequences verifying drafts in one step.

    One slot more than ``num_slots`` is allocated and never handed out: ``pad_slot``, which the
    padding sequences of a CUDA graph read and write; likewise one scratch row more,
    ``pad_scratch_row``, for graph sequences that verify no drafts.
    """

    def __init__(self, num_layers: int, shape: LinearAttnShape, num_slots: int, dtype: torch.dtype,
                 ssm_dtype: torch.dtype, device: torch.device, max_drafts: int = 0,
                 scratch_rows: int = 0):
        s = shape
        self.shape, self.num_slots, self.pad_slot = shape, num_slots, num_slots
        conv_shape = (s.conv_dim, s.kernel - 1)
        ssm_shape = (s.num_v_heads, s.head_k_dim, s.head_v_dim)
        # every layer's tensor is a view of one stacked tensor per kind, so that copying a
        # slot (or committing a scratch position) is one copy for all layers, not one per layer
        L = num_layers
        self._conv = torch.zeros(L, num_slots + 1, *conv_shape, dtype=dtype, device=device)
        self._ssm = torch.zeros(L, num_slots + 1, *ssm_shape, dtype=ssm_dtype, device=device)
        rows, pos = (scratch_rows + 1, max_drafts + 1) if max_drafts else (0, 0)
        self.pad_scratch_row = scratch_rows
        self._conv_scratch = torch.zeros(L, rows, pos, *conv_shape, dtype=dtype, device=device)
        self._ssm_scratch = torch.zeros(L, rows, pos, *ssm_shape, dtype=ssm_dtype, device=device)
        self.conv, self.ssm = list(self._conv.unbind(0)), list(self._ssm.unbind(0))
        self.conv_scratch = list(self._conv_scratch.unbind(0))
        self.ssm_scratch = list(self._ssm_scratch.unbind(0))
        self._free = list(range(num_slots - 1, -1, -1))
        logger.info("recurrent state: %d slots x %d layers (%.1f MiB, %.1f MiB per request)",
                    num_slots, num_layers, self.nbytes / 2**20,
                    self.bytes_per_slot(num_layers, shape, dtype, ssm_dtype) / 2**20)

    @staticmethod
    def bytes_per_slot(num_layers: int, s: LinearAttnShape, dtype: torch.dtype,
                       ssm_dtype: torch.dtype) -> int:
        """Bytes one request's state takes over all linear-attention layers."""
        conv = s.conv_dim * (s.kernel - 1) * (torch.finfo(dtype).bits // 8)
        ssm = s.num_v_heads * s.head_k_dim * s.head_v_dim * (torch.finfo(ssm_dtype).bits // 8)
        return num_layers * (conv + ssm)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self._conv, self._ssm,
                                                          self._conv_scratch, self._ssm_scratch))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        """A zeroed slot for a request starting from its first token, or None when all are taken."""
        if not self._free:
            return None
        slot = self._free.pop()
        self._conv[:, slot].zero_()
        self._ssm[:, slot].zero_()
        return slot

    def free(self, slot: int) -> None:
        self._free.append(slot)

    def copy_slot(self, src: int, dst: int) -> None:
        """Make slot ``dst`` hold slot ``src``'s state (every layer)."""
        self._conv[:, dst].copy_(self._conv[:, src])
        self._ssm[:, dst].copy_(self._ssm[:, src])

    def commit_rows(self, slots: torch.Tensor, rows: torch.Tensor,
                    positions: torch.Tensor) -> None:
        """:meth:`commit` for B sequences from device tensors (no host sync): ``slots[b]`` takes
        the state after query token ``positions[b]`` of scratch row ``rows[b]`` (all [B] int64;
        slots distinct). On CUDA one copy kernel for both state kinds
        (kernels/state_commit_triton.py: each state read once); elsewhere index_select /
        index_copy_ over the rows flattened with the positions."""
        if use_triton(self._ssm):
            from mtpserve.kernels.state_commit_triton import commit_states

            commit_states([(self._ssm, self._ssm_scratch), (self._conv, self._conv_scratch)],
                          slots, rows, positions)
            return
        flat = torch.add(positions, rows, alpha=self._conv_scratch.shape[2])  # row * P + pos
        for pool, scratch in ((self._conv, self._conv_scratch), (self._ssm, self._ssm_scratch)):
            by_row = scratch.view(scratch.shape[0], -1, *scratch.shape[3:])   # [L, R * P, ...]
            pool.index_copy_(1, slots, by_row.index_select(1, flat))

    def commit(self, slot: int, scratch_row: int, position: int) -> None:
        """Make ``slot`` hold the state after query token ``position`` of a verify step (two
        copies over all layers)."""
        self._conv[:, slot].copy_(self._conv_scratch[:, scratch_row, position])
        self._ssm[:, slot].copy_(self._ssm_scratch[:, scratch_row, position])


class LinearAttnMetadata:
    """What linear-attention layers read from ``batch.extra["linear_attn"]``.

    Args:
        cache: the StateCache; slots: [B] int64 on the device, each sequence's state slot (read
            as the initial state, overwritten with the state after its last query token), or
            None: uploaded from ``slots_cpu`` to ``device`` at first use (a step that replays a
            CUDA graph writes the graph's own slots input from the host list and never needs
            it); slots_cpu: the same as a host list; scratch_rows (host list, one per sequence):
            the scratch row to write per-token states to, or -1 when the sequence verifies no
            drafts; device: where ``slots`` goes when uploaded.
    """

    def __init__(self, cache: StateCache, slots: torch.Tensor | None, slots_cpu: list[int],
                 scratch_rows: list[int], device: torch.device | None = None):
        self.cache, self._slots, self.slots_cpu = cache, slots, slots_cpu
        self.scratch_rows, self._device = scratch_rows, device

    @property
    def slots(self) -> torch.Tensor:
        if self._slots is None:
            self._slots = to_device(self.slots_cpu, torch.int64, self._device)
        return self._slots

    def adopt_slots(self, t: torch.Tensor) -> None:
        """Take ``t`` [B] int64, a device tensor holding ``slots_cpu`` already, as ``slots``
        unless they were uploaded (a CUDA graph's static input once the step wrote it: read by
        the step's own kernels, queued before the next step rewrites it), so the step uploads
        none of its own."""
        if self._slots is None:
            self._slots = t
