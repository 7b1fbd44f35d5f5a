"""Shared fixtures: the real SmolLM2-135M-Instruct model, ours and HF transformers' (float32)."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_configure(config):
    """Under pytest-xdist (scripts/test.sh runs ``-n auto``) each worker takes its share of the
    cores for torch's threads (two workers of 2 threads each would oversubscribe CI's 2 cores)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


# Test files run by one pytest-xdist worker together under --dist loadfile: both need
# ``hf_smollm2`` (a session fixture, built once per worker: HF's GGUF loading takes ~25 s of one
# core, and the two files need different things of the model, its weights and its greedy
# generation, so there is nothing smaller to share between two workers).
SAME_WORKER = {"test_generate_real.py": "test_loader.py"}


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the files of SAME_WORKER sent to one worker as one unit of work
    (other modes: pytest-xdist's own scheduler)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            folder, _, name = scope.rpartition("/")
            return f"{folder}/{SAME_WORKER[name]}" if name in SAME_WORKER else scope

    return Scheduling(config, log)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from mtpserve.loader import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path):
    """HF transformers' own GGUF loading of the real model: the reference implementation."""
    from transformers import AutoModelForCausalLM

    d, f = os.path.dirname(smollm2_path), os.path.basename(smollm2_path)
    return AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm2_llm():
    """Our engine over the real model, float32 on CPU (a 2048-token context keeps the KV small)."""
    from mtpserve import LLM

    return LLM(None, dtype="float32", device="cpu", max_model_len=2048, num_kv_blocks=1024)


@pytest.fixture(autouse=True)
def _collect_engines():
    """Engines hold ~1 GB each on CPU (float32 weights, their MKL-packed copy, the KV cache) and
    sit in reference cycles (engine <-> proposer): free them after each test, not at some later
    garbage collection, so the suite fits in CI's memory."""
    yield
    import gc

    gc.collect()
