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


@pytest.fixture(scope="module", autouse=True)
def _freeze_what_outlives_the_module():
    """Before each test file's own fixtures: collect what the last file left in cycles (its
    module-scoped engines), then freeze every object still alive (``gc.freeze``: modules,
    classes and functions of torch, transformers and the test files, session fixtures), so that
    the collection after each test below walks only what was made since. A full collection of
    the ~300k-600k objects alive in a worker took ~0.35 s, and ran after each of ~640 tests: 226
    of the suite's 1157 test-seconds were teardowns (the xdist run of 2026-12-03). Frozen objects
    are still freed by reference counting; only garbage cycles among them would stay, and what
    lives at a module's start lives on (imported modules, session fixtures)."""
    import gc

    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(scope="session", autouse=True)
def _unfreeze_at_the_end():
    """The frozen objects back under the collector when the session ends (else extension types
    still alive at exit report themselves as leaked, e.g. nanobind's in Triton)."""
    yield
    import gc

    gc.unfreeze()
    gc.collect()


@pytest.fixture(autouse=True)
def _collect_engines():
    """Engines hold ~1 GB each on CPU (float32 weights, their MKL-packed copy, the KV cache) and
    sit in reference cycles (engine <-> proposer): free them after each test, not at some later
    garbage collection, so the suite fits in CI's memory."""
    yield
    import gc

    gc.collect()
