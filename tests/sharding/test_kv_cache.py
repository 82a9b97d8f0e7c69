"""``KVCache``: shapes per model layout, slot allocation and freeing, clear errors."""

from __future__ import annotations

import pytest
import torch

from sharding.config import ModelConfig
from sharding.errors import CacheFull, InvalidLayout
from sharding.kv_cache import DEFAULT_KV_CACHE_BYTES, DEFAULT_MAX_LEN, KVCache, fit_max_len
from sharding.model import Llama


def test_shape_follows_the_model(tiny_dir):
    config = ModelConfig.from_pretrained(tiny_dir / "full")
    cache = KVCache.for_model(Llama(config, layer_range=(1, 2)), num_slots=3, max_len=40)
    assert len(cache.k) == len(cache.v) == 1
    assert cache.k[0].shape == cache.v[0].shape == (3, 40, config.num_kv_heads, config.head_dim)
    assert KVCache.for_model(Llama(config), num_slots=1).k[0].shape[1] == min(config.max_position_embeddings, DEFAULT_MAX_LEN)
    with pytest.raises(InvalidLayout, match="not within the model's context"):
        KVCache.for_model(Llama(config), num_slots=1, max_len=config.max_position_embeddings + 1)


LLAMA31 = {"model_type": "llama", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "max_position_embeddings": 131072, "rope_theta": 500000.0,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}


def test_a_131k_context_gets_a_default_length_and_a_budget():
    """A Llama 3.x config keeps 131,072 positions: the cache takes DEFAULT_MAX_LEN, not the context."""
    config = ModelConfig.from_dict(LLAMA31)
    cache = KVCache.for_model(Llama(config), num_slots=8)
    assert cache.max_len == DEFAULT_MAX_LEN < config.max_position_embeddings
    assert cache.k[0].numel() * 4 * 2 * 4 <= DEFAULT_KV_CACHE_BYTES
    # A smaller budget: the default shrinks to what fits; an explicit length over it is refused by name.
    per_position = 8 * 4 * 2 * 2 * 16 * 4
    assert fit_max_len(config, num_slots=8, layers=4, kv_heads=2, dtype=torch.float32,
                       kv_cache_bytes=1000 * per_position) == 1000
    with pytest.raises(InvalidLayout, match="max_len 2000 x num_slots 8 needs .* kv_cache_bytes") as info:
        fit_max_len(config, num_slots=8, layers=4, kv_heads=2, dtype=torch.float32, max_len=2000,
                    kv_cache_bytes=1000 * per_position)
    assert info.value.code == "invalid_layout"
    with pytest.raises(InvalidLayout, match="cannot hold one position"):
        fit_max_len(config, num_slots=8, layers=4, kv_heads=2, dtype=torch.float32, kv_cache_bytes=10)
    # bfloat16 halves the bytes: twice the positions.
    assert fit_max_len(config, num_slots=8, layers=4, kv_heads=2, dtype=torch.bfloat16,
                       kv_cache_bytes=1000 * per_position) == 2000


def test_allocate_until_full_then_reuse():
    cache = KVCache(num_layers=1, num_slots=3, max_len=4, num_kv_heads=1, head_dim=2)
    assert [cache.allocate() for _ in range(3)] == [0, 1, 2] and cache.num_free == 0
    with pytest.raises(CacheFull, match="all 3") as info:
        cache.allocate()
    assert info.value.code == "kv_cache_full"
    cache.free(1)
    cache.free(0)
    assert cache.num_free == 2 and cache.allocate() == 0
    with pytest.raises(RuntimeError, match="not allocated"):
        cache.free(1)


def test_bad_sizes():
    with pytest.raises(InvalidLayout, match="num_slots"):
        KVCache(num_layers=1, num_slots=0, max_len=4, num_kv_heads=1, head_dim=2)

