"""What the start of ``mtpserve serve`` imports, checked in fresh interpreters via sys.modules.

The HTTP side and the command line must not import torch, transformers or the GGUF stack (the
engine thread imports what the checkpoint needs), and an HF checkpoint must not pull in gguf or
the Llama config (``LlamaConfig`` drags transformers.activations, torch.distributed.tensor and
sympy along), nor transformers' auto_factory / AutoTokenizer (on transformers 5.17 they import
GenerationMixin, torch._dynamo, scikit-learn and sympy: see mtpserve.loader.configs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "gguf", "numpy", "safetensors", "sympy", "matplotlib")
# What reading a config and tokenizer must not import (transformers' model-loading machinery)
MODEL_LOADING = ("transformers.models.auto.auto_factory", "transformers.models.auto.tokenization_auto",
                 "transformers.generation.utils", "torch._dynamo", "torch.distributed.tensor",
                 "sklearn", "sympy")


def modules_after(code: str, *watch: str, env: dict | None = None) -> set[str]:
    """The names of ``watch`` present in ``sys.modules`` after running ``code`` in a fresh
    interpreter (whose stdout must stay free for the answer)."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {list(watch)!r} if m in sys.modules]))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", ["mtpserve", "mtpserve.cli", "mtpserve.server.api",
                                    "mtpserve.server.wait_ready", "mtpserve.loader"])
def test_light_modules_import_nothing_heavy(module):
    assert modules_after(f"import {module}", *HEAVY) == set()


def test_cli_builds_every_parser_without_torch():
    code = ("import contextlib, io\nfrom mtpserve.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    main(['serve', '--help'])")
    assert modules_after(code, *HEAVY) == set()


def test_token_map_help_keeps_its_description(capsys):
    from mtpserve.cli import main
    from mtpserve.spec.token_map_build import DESCRIPTION

    with pytest.raises(SystemExit) as e:
        main(["token-map", "--help"])
    assert e.value.code == 0
    assert "".join(DESCRIPTION.split()) in "".join(capsys.readouterr().out.split())


def test_hf_qwen3_dir_loads_without_gguf_or_llama(tmp_path):
    from safetensors.torch import save_file
    import torch
    from transformers import Qwen3Config

    from mtpserve.bench.random_model import word_tokenizer

    Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=8).save_pretrained(tmp_path)
    word_tokenizer(64).save_pretrained(tmp_path)
    save_file({"model.norm.weight": torch.ones(16)}, str(tmp_path / "model.safetensors"))
    code = (f"from mtpserve.loader import load_model_files\n"
            f"f = load_model_files({str(tmp_path)!r})\n"
            f"assert f.hf_config.model_type == 'qwen3' and f.kind == 'hf'")
    assert modules_after(code, "gguf", "transformers.models.llama", "mtpserve.loader.gguf_loader",
                         "transformers", *MODEL_LOADING) == {"transformers"}
