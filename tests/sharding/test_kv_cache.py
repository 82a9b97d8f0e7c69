"""``KVCache``: shapes per model layout, slot allocation and freeing, clear errors."""

from __future__ import annotations

import pytest

from sharding.config import ModelConfig
from sharding.errors import CacheFull, InvalidLayout
from sharding.kv_cache import KVCache
from sharding.model import Llama


def test_shape_follows_the_model(tiny_dir):
    config = ModelConfig.from_pretrained(tiny_dir / "full")
    cache = KVCache.for_model(Llama(config, layer_range=(1, 2)), num_slots=3, max_len=40)
    assert len(cache.k) == len(cache.v) == 1
    assert cache.k[0].shape == cache.v[0].shape == (3, 40, config.num_kv_heads, config.head_dim)
    assert KVCache.for_model(Llama(config), num_slots=1).k[0].shape[1] == config.max_position_embeddings
    with pytest.raises(InvalidLayout, match="exceeds the model's context"):
        KVCache.for_model(Llama(config), num_slots=1, max_len=config.max_position_embeddings + 1)


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

