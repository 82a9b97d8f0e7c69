"""``ModelConfig`` from Hugging Face ``config.json``: both RoPE spellings, eos lists, clear errors."""

from __future__ import annotations

import json

import pytest

from sharding.config import Llama3RopeScaling, ModelConfig
from sharding.errors import InvalidConfig

BASE = {"model_type": "llama", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "eos_token_id": 1, "bos_token_id": 0}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}


def test_reads_the_tiny_checkpoints(tiny_dir):
    full = ModelConfig.from_pretrained(tiny_dir / "full")
    shape = (full.num_layers, full.hidden_size, full.num_heads, full.num_kv_heads, full.head_dim)
    assert shape == (2, 128, 4, 2, 32)
    assert not full.tie_word_embeddings and full.rope_scaling is None and full.rope_theta == 10000.0
    assert full.bos_token_id == 0 and full.eos_token_ids == (1,) and full.num_queries_per_kv == 2
    fast = ModelConfig.from_pretrained(tiny_dir / "fast" / "config.json")
    assert fast.tie_word_embeddings and fast.num_kv_heads == 1


@pytest.mark.parametrize("rope", [
    {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **LLAMA3}},  # transformers 5
    {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", **LLAMA3}},     # transformers 4
    {"rope_theta": 5e5, "rope_scaling": {"type": "llama3", **LLAMA3}},          # older still
])
def test_llama3_rope_in_every_spelling(rope):
    cfg = ModelConfig.from_dict({**BASE, **rope})
    assert cfg.rope_theta == 5e5 and cfg.rope_scaling == Llama3RopeScaling(**LLAMA3)


def test_defaults():
    raw = {k: v for k, v in BASE.items() if k not in ("num_key_value_heads", "eos_token_id")}
    cfg = ModelConfig.from_dict({**raw, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                                 "rope_scaling": None})
    assert cfg.num_kv_heads == 4 and cfg.head_dim == 8
    assert cfg.eos_token_ids == () and cfg.rope_scaling is None
    assert ModelConfig.from_dict({**BASE, "eos_token_id": [1, 7]}).eos_token_ids == (1, 7)
    no_original = {"rope_type": "llama3", **LLAMA3}
    del no_original["original_max_position_embeddings"]
    cfg = ModelConfig.from_dict({**BASE, "rope_scaling": no_original})
    assert cfg.rope_scaling.original_max_position_embeddings == 64  # transformers' fallback


@pytest.mark.parametrize("change, message", [
    ({"num_key_value_heads": 3}, "not a multiple of num_kv_heads"),
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"hidden_act": "relu"}, "hidden_act"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config: 'fp8'"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"vocab_size": None}, "lacks"),
    ({"hidden_size": 0}, "positive"),
    ({"eos_token_id": 100}, "outside the vocabulary"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'.*not supported"),
    ({"rope_scaling": {"rope_type": "ntk-by-parts", "factor": 2.0}}, "not supported"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "longrope rope scaling lacks"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": None,
      "layer_types": ["sliding_attention", "full_attention"]}, "sliding_window >= 1"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "lacks"),
    ({"rope_scaling": {"rope_type": "llama3", **LLAMA3, "high_freq_factor": 0.5}}, "low_freq_factor"),
])
def test_invalid_config_raises(change, message):
    with pytest.raises(InvalidConfig, match=message) as info:
        ModelConfig.from_dict({**BASE, **change})
    assert info.value.code == "invalid_config" and isinstance(info.value, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(InvalidConfig, match="no config.json"):
        ModelConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    assert ModelConfig.from_pretrained(tmp_path).vocab_size == 100
