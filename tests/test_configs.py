"""mtpserve.loader.configs and the direct tokenizer route: the same objects as AutoConfig /
AutoTokenizer, with less imported.

Configs are compared across fresh interpreters (ours against plain AutoConfig), since a config
class, once imported, stays imported: every field of the config object, its class, and its
``to_dict()``. Tokenizers are compared in this process on the real SmolLM2 tokenizer (the GGUF cache
entry) and on word-level tokenizer directories.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mtpserve.bench.random_model import SHAPES, word_tokenizer

# model type -> AutoConfig.for_model kwargs of the directories compared
DIR_CONFIGS = {
    "llama": {k: v for k, v in SHAPES["tiny-llama"].items() if k != "model_type"},
    "qwen2": dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1),
    "qwen3": {k: v for k, v in SHAPES["qwen3-1.7b"].items() if k != "model_type"},
    "qwen3_next": {k: v for k, v in SHAPES["tiny-qwen3-next"].items() if k != "model_type"},
    "qwen3_5": {},
    "qwen3_5_moe": {},
}

DUMP = """
import json, sys
def dump(c):
    return {"class": f"{type(c).__module__}.{type(c).__qualname__}", "to_dict": c.to_json_string(),
            "fields": {k: repr(v) for k, v in sorted(vars(c).items())}}
"""


def run_fresh(code: str) -> dict:
    """The JSON that ``code`` prints last, run in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", DUMP + code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def config_dirs(tmp_path_factory) -> dict[str, str]:
    from transformers import AutoConfig

    root = tmp_path_factory.mktemp("configs")
    dirs = {}
    for model_type, kw in DIR_CONFIGS.items():
        dirs[model_type] = str(root / model_type)
        AutoConfig.for_model(model_type, **kw).save_pretrained(dirs[model_type])
    return dirs


def test_load_config_equals_autoconfig(config_dirs):
    """Every field, the class and to_dict() of each directory's config; ours also leaves
    auto_factory (and with it transformers 5.17's GenerationMixin chain) unimported."""
    body = "\nout = {{t: dump({call}(d)) for t, d in {dirs!r}.items()}}\n"
    ours = run_fresh("from mtpserve.loader.configs import load_config" +
                     body.format(call="load_config", dirs=config_dirs) +
                     "out['imported'] = 'transformers.models.auto.auto_factory' in sys.modules\n"
                     "print(json.dumps(out))")
    ref = run_fresh("from transformers import AutoConfig" +
                    body.format(call="AutoConfig.from_pretrained", dirs=config_dirs) +
                    "print(json.dumps(out))")
    assert ours.pop("imported") is False
    assert set(ours) == set(ref) == set(DIR_CONFIGS)
    for model_type in DIR_CONFIGS:
        assert ours[model_type] == ref[model_type], model_type


def test_config_for_model_and_config_class_equal_autoconfig():
    shapes = {name: dict(kw) for name, kw in SHAPES.items()}
    body = ("\nout = {{n: dump({call}(kw.pop('model_type'), **kw)) for n, kw in {shapes!r}.items()}}\n"
            "out['classes'] = {{n: {cls}(n).__module__ for n in "
            "('LlamaConfig', 'Qwen2Config', 'Qwen3Config', 'Qwen3NextConfig')}}\n"
            "print(json.dumps(out))")
    ours = run_fresh("from mtpserve.loader.configs import config_for_model, config_class" +
                     body.format(call="config_for_model", cls="config_class", shapes=shapes))
    ref = run_fresh("import transformers\nfrom transformers import AutoConfig" +
                    body.format(call="AutoConfig.for_model",
                                cls="(lambda n: getattr(transformers, n))", shapes=shapes))
    assert ours == ref


def test_plain_config_docstrings_restores_the_decorator():
    import importlib

    from mtpserve.loader.configs import plain_config_docstrings

    module = importlib.import_module("transformers.utils.auto_docstring")
    original = module.auto_class_docstring
    with plain_config_docstrings():
        with plain_config_docstrings():
            assert module.auto_class_docstring is not original
        assert module.auto_class_docstring is not original
    assert module.auto_class_docstring is original
    with pytest.raises(RuntimeError), plain_config_docstrings():
        raise RuntimeError
    assert module.auto_class_docstring is original


def test_plain_config_docstrings_is_the_calling_thread_s_alone():
    """While one thread is inside ``plain_config_docstrings``, a class another thread decorates
    at the same time (e.g. a model class imported there) still gets its generated docstring;
    the thread inside keeps the class's own."""
    import threading

    from transformers import PretrainedConfig
    from transformers.utils import auto_docstring

    from mtpserve.loader.configs import plain_config_docstrings

    def decorated():   # a top-level class (a nested qualname is documented as a method)
        cls = type("ProbeConfig", (PretrainedConfig,),
                   {"__doc__": "source doc", "__qualname__": "ProbeConfig",
                    "__module__": __name__})
        return auto_docstring(custom_intro="Generated intro")(cls).__doc__

    inside, outside, done = threading.Event(), {}, threading.Event()

    def hold():
        with plain_config_docstrings():
            outside["inside"] = decorated()
            inside.set()
            done.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert inside.wait(30)
        other = decorated()           # this thread, while the other one is inside
    finally:
        done.set()
        t.join()
    assert outside["inside"] == "source doc"
    assert "Generated intro" in other


# ---------------------------------------------------------------------------------- tokenizers


def test_backend_model_types_agree_with_installed_autotokenizer():
    """``BACKEND_MODEL_TYPES`` rests on AutoTokenizer keeping a TokenizersBackend named in
    tokenizer_config.json for these types; a transformers that changes that fails here."""
    from transformers.models.auto import tokenization_auto as ta

    from mtpserve.loader.tokenizer import BACKEND_MODEL_TYPES

    for model_type in BACKEND_MODEL_TYPES:
        assert model_type not in ta.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, model_type
        assert ta.TOKENIZER_MAPPING_NAMES.get(model_type) != "MistralCommonBackend", model_type


def _assert_same_tokenizer(tok, ref, texts, chats=()):
    assert type(tok) is type(ref)
    assert tok.get_vocab() == ref.get_vocab()
    assert tok.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()
    assert tok.chat_template == ref.chat_template
    assert tok.special_tokens_map == ref.special_tokens_map
    assert tok.all_special_ids == ref.all_special_ids
    assert tok.added_tokens_decoder == ref.added_tokens_decoder
    for role in ("eos", "bos", "pad", "unk"):
        assert getattr(tok, f"{role}_token_id") == getattr(ref, f"{role}_token_id"), role
    assert (tok.model_max_length, tok.padding_side, tok.truncation_side) == \
           (ref.model_max_length, ref.padding_side, ref.truncation_side)
    assert tok.init_kwargs == ref.init_kwargs
    for text in texts:
        ids = ref.encode(text)
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == ref.decode(ids)
    for chat in chats:
        for gen in (False, True):
            assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen) == \
                   ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            assert tok.apply_chat_template(chat, add_generation_prompt=gen, return_dict=False) == \
                   ref.apply_chat_template(chat, add_generation_prompt=gen, return_dict=False)


def test_smollm2_cache_tokenizer_equals_autotokenizer():
    """The real SmolLM2 tokenizer as the GGUF cache entry holds it (TokenizersBackend, llama)."""
    from transformers import AutoTokenizer

    from mtpserve.loader import default_model_path, load_model_files
    from mtpserve.loader.tokenizer import load_tokenizer, loads_as_backend

    try:
        default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    entry = load_model_files(None).cache_dir
    assert entry is not None and loads_as_backend(entry)
    texts = ["Hello, world!", "  two  spaces", "Grüße aus Köln 🙂", "<|im_start|>user\nhi<|im_end|>",
             "def f(x):\n    return x ** 2", ""]
    chats = [[{"role": "user", "content": "What is 2+2?"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hallo!"}, {"role": "user", "content": "Und?"}]]
    _assert_same_tokenizer(load_tokenizer(entry), AutoTokenizer.from_pretrained(entry), texts, chats)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "qwen3_next", None])
def test_word_tokenizer_dirs_equal_autotokenizer(tmp_path, config_dirs, model_type):
    from transformers import AutoTokenizer

    from mtpserve.loader.tokenizer import load_tokenizer, loads_as_backend

    if model_type is not None:
        with open(os.path.join(config_dirs[model_type], "config.json")) as f:
            (tmp_path / "config.json").write_text(f.read())
    word_tokenizer(64).save_pretrained(tmp_path)
    assert loads_as_backend(str(tmp_path))
    _assert_same_tokenizer(load_tokenizer(str(tmp_path)), AutoTokenizer.from_pretrained(tmp_path),
                           ["w2 w3 w63", "w1 nope w5", ""])


def _tokenizer_dir(tmp_path, model_type="qwen3", tokenizer_class=None, **extra) -> str:
    word_tokenizer(64).save_pretrained(tmp_path)
    path = tmp_path / "tokenizer_config.json"
    tok_config = json.loads(path.read_text())
    tok_config.update(extra)
    if tokenizer_class is not None:
        tok_config["tokenizer_class"] = tokenizer_class
    path.write_text(json.dumps(tok_config))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(tmp_path)


@pytest.mark.parametrize("case", ["qwen2", "qwen3_5", "gpt2_class", "auto_map", "no_tokenizer_json",
                                  "remote_config"])
def test_other_dirs_go_through_autotokenizer(tmp_path, case):
    from mtpserve.loader.tokenizer import loads_as_backend

    if case in ("qwen2", "qwen3_5"):
        folder = _tokenizer_dir(tmp_path, model_type=case)
    elif case == "gpt2_class":
        folder = _tokenizer_dir(tmp_path, tokenizer_class="GPT2Tokenizer")
    elif case == "auto_map":
        folder = _tokenizer_dir(tmp_path, auto_map={"AutoTokenizer": [None, "x.XTokenizer"]})
    elif case == "no_tokenizer_json":
        folder = _tokenizer_dir(tmp_path)
        os.remove(os.path.join(folder, "tokenizer.json"))
    else:
        folder = _tokenizer_dir(tmp_path)
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3",
                                                          "auto_map": {"AutoConfig": "x.C"}}))
    assert not loads_as_backend(folder)
