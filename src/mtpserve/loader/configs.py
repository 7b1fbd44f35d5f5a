"""Transformers configs without importing transformers' model-loading machinery.

Why: transformers 5.17 (on our GPU machine) decorates every config class with ``@auto_docstring``.
On a class, the decorator (``auto_class_docstring``) looks the model up in
``transformers.models.auto.modeling_auto``, whose ``auto_factory`` imports ``GenerationMixin`` at
module level in 5.17: ``generation.utils`` -> ``masking_utils`` -> ``torch._dynamo`` (whose trace
rules import scikit-learn when it is installed) and ``distributed.fsdp`` ->
``torch.distributed.tensor`` -> sympy. So the first config of a process, whichever way it is
reached (``AutoConfig.from_pretrained``, ``AutoConfig.for_model``, ``CONFIG_MAPPING[model_type]``,
``transformers.models.qwen3.configuration_qwen3``, ``getattr(transformers, "Qwen3Config")``), costs
all of that: importing the config class module directly does not help. transformers 5.24 imports
``GenerationMixin`` lazily in ``auto_factory``, so the same lookup is cheap there.

The decorator only writes the class's ``__doc__``. While a config class is imported,
``plain_config_docstrings`` swaps it for one that returns the class as defined (in the importing
thread only: other threads keep the generated docstrings). The config object
built is still AutoConfig's own (same calls, same class, same fields: tests/test_configs.py checks
this against plain AutoConfig in fresh interpreters); only the config class's docstring is the one
in its source instead of the generated one.

Measured on the CPU dev box (torch 2.13 CPU, Python 3.11; wall time in a fresh interpreter,
``import transformers`` and torch (0.85 s alone) included; "+sklearn": scikit-learn installed, as
on the GPU machine; qwen3 directory):

=====================================================  ===============  =====
route                                                  5.17 (+sklearn)  5.24
=====================================================  ===============  =====
``AutoConfig.from_pretrained``                         2.9 s (3.5 s)    1.6 s
``CONFIG_MAPPING[t].from_pretrained``                  2.6 s (3.3 s)    1.6 s
``configuration_qwen3.Qwen3Config.from_pretrained``    2.7 s (3.4 s)    1.6 s
``load_config`` (here)                                 1.7 s (1.8 s)    1.5 s
the same, torch already imported: AutoConfig / ours    1.9 / 0.8 s      0.7 / 0.7 s
                                                       (2.6 / 0.8 s)
=====================================================  ===============  =====

Not covered: ``LlamaConfig``'s module imports ``transformers.activations`` (via
``utils.type_validators``), which imports ``torch.distributed.tensor`` and sympy on both versions.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_lock = threading.Lock()
_depth = 0                    # threads' contexts open now (the swap is installed while > 0)
_saved: Any = None
_local = threading.local()    # .depth: this thread's contexts open now


def _class_docstring(original):
    """The swap for ``auto_class_docstring``: the class as defined in a thread inside
    :func:`plain_config_docstrings`, ``original`` elsewhere (a class another thread decorates
    meanwhile, e.g. a model class it imports, still gets its generated docstring)."""
    def auto_class_docstring(cls, *args, **kwargs):
        if getattr(_local, "depth", 0):
            return cls
        return original(cls, *args, **kwargs)

    auto_class_docstring.original = original
    return auto_class_docstring


@contextlib.contextmanager
def plain_config_docstrings() -> Iterator[None]:
    """Within (in the calling thread): classes decorated with transformers' ``@auto_docstring``
    keep their source docstring instead of one generated from the auto mappings (methods are
    untouched).

    Nesting and concurrent use from several threads are fine: the swap is installed while any
    thread is inside, acts only in those threads, and the original is put back when the last
    one leaves. Does nothing when transformers has no ``utils.auto_docstring.auto_class_docstring``.
    """
    global _depth, _saved
    try:
        module = importlib.import_module("transformers.utils.auto_docstring")
    except ImportError:
        module = None
    if module is None or not hasattr(module, "auto_class_docstring"):
        yield
        return
    with _lock:
        if _depth == 0:
            _saved = module.auto_class_docstring
            module.auto_class_docstring = _class_docstring(_saved)
        _depth += 1
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
        with _lock:
            _depth -= 1
            if _depth == 0:
                module.auto_class_docstring = _saved


def load_config(folder: str) -> PretrainedConfig:
    """``AutoConfig.from_pretrained(folder)``, without the import chain described above."""
    from transformers import AutoConfig

    with plain_config_docstrings():
        return AutoConfig.from_pretrained(folder)


def config_for_model(model_type: str, **kwargs: Any) -> PretrainedConfig:
    """``AutoConfig.for_model(model_type, **kwargs)``, without the import chain described above."""
    from transformers import AutoConfig

    with plain_config_docstrings():
        return AutoConfig.for_model(model_type, **kwargs)


def config_class(name: str) -> type[PretrainedConfig]:
    """The transformers config class called ``name`` (e.g. ``"Qwen3Config"``), imported without
    the chain described above (``AttributeError`` for an unknown name)."""
    import transformers

    with plain_config_docstrings():
        return getattr(transformers, name)
