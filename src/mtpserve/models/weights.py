"""Loading checkpoint tensors into a model whose parameters may stack several of them."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch
from torch import nn

# (our parameter name fragment, checkpoint name fragment, shard id) for fused projections.
STACKED_LLAMA = (
    (".qkv_proj.", ".q_proj.", "q"),
    (".qkv_proj.", ".k_proj.", "k"),
    (".qkv_proj.", ".v_proj.", "v"),
    (".gate_up_proj.", ".gate_proj.", 0),
    (".gate_up_proj.", ".up_proj.", 1),
)


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                 stacked: tuple = STACKED_LLAMA, skip: tuple[str, ...] = (),
                 rename=lambda name: name) -> set[str]:
    """Copy checkpoint tensors into ``model``'s parameters; return the names loaded.

    ``weights`` yields (checkpoint name, tensor). A tensor whose name contains a ``stacked``
    checkpoint fragment goes into the fused parameter with that shard id; names containing any
    ``skip`` fragment are ignored; ``rename`` maps a checkpoint name before matching.

    Raises:
        ValueError: a checkpoint tensor that matches no parameter, or a shape mismatch.
    """
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for ckpt_name, tensor in weights:
        name = rename(ckpt_name)
        if name is None or any(s in name for s in skip):
            continue
        target, shard = _target(name, stacked)
        if target not in params:
            raise ValueError(f"checkpoint tensor {ckpt_name!r} matches no model parameter")
        param = params[target]
        loader = getattr(param, "weight_loader", None)
        with torch.no_grad():
            if loader is None:
                _check_shape(ckpt_name, param, tensor)
                param.data.copy_(tensor)
            elif shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard)
        loaded.add(target)
    return loaded


def parameter_storage(model: nn.Module) -> list[tuple[int, int]]:
    """(bytes, bytes an element) of each distinct storage behind ``model``'s parameters:
    parameters that are views of one tensor (the merged router, a shared expert folded into
    the experts' tensors: layers/moe.py) count once."""
    return list({p.untyped_storage().data_ptr(): (p.untyped_storage().nbytes(), p.element_size())
                 for p in model.parameters()}.values())


def process_weights_after_loading(model: nn.Module) -> None:
    """Call ``process_weights_after_loading()`` (vLLM's name) on every submodule of ``model``
    that has it, once the checkpoint is loaded: a layer may reorder or repack its weights for
    the kernels of its device (``LlamaMLP`` interleaves its gate/up rows on CUDA)."""
    for module in model.modules():
        hook = getattr(module, "process_weights_after_loading", None)
        if callable(hook):
            hook()


def _target(name: str, stacked: tuple) -> tuple[str, object]:
    for ours, theirs, shard in stacked:
        if theirs in name:
            return name.replace(theirs, ours), shard
    return name, None


def _check_shape(name: str, param: torch.Tensor, tensor: torch.Tensor) -> None:
    if tuple(param.shape) != tuple(tensor.shape):
        raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != "
                         f"parameter shape {tuple(param.shape)}")


def check_all_loaded(model: nn.Module, loaded: set[str], optional: tuple[str, ...] = ()) -> None:
    """Raise ``ValueError`` naming every parameter the checkpoint did not provide."""
    missing = [n for n, _ in model.named_parameters()
               if n not in loaded and not any(o in n for o in optional)]
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s): {shown}")


def iter_prefixed(weights: Iterable[tuple[str, torch.Tensor]],
                  prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Only the tensors under ``prefix`` (kept whole)."""
    return ((n, t) for n, t in weights if n.startswith(prefix))
