"""What a vLLM lane asks vLLM for when its config leaves it to the model: context and KV-cache size.

vLLM's own defaults size the context from the model (a Llama 3.x's 131,072 positions) and the KV
cache from a share of GPU memory; on a CPU the KV cache is a fixed number of bytes, and a cache
that cannot hold one whole sequence makes vLLM refuse to start. So, for a lane's ``max_model_len``
left unset, the model's context up to ``DEFAULT_MAX_LEN``; for ``kv_cache_memory_bytes: auto``,
room for ``max_num_seqs`` sequences of that length, at most ``DEFAULT_KV_CACHE_BYTES`` but never
less than one whole sequence (vLLM's admission then waits for room as usual).
"""

from __future__ import annotations

from typing import Any

from sharding.config import ModelConfig
from sharding.kv_cache import DEFAULT_KV_CACHE_BYTES, DEFAULT_MAX_LEN

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def vllm_sizes(raw_config: dict[str, Any], lane: Any) -> dict[str, Any]:
    """``max_model_len`` and ``kv_cache_memory_bytes`` for vLLM's engine args, from the checkpoint's
    ``config.json`` fields (``raw_config``) and the lane's config (a ``VLLMLaneConfig``)."""
    context = int(raw_config.get("max_position_embeddings") or DEFAULT_MAX_LEN)
    if "text_config" in raw_config:  # multimodal configs keep the decoder's fields inside
        context = int(raw_config["text_config"].get("max_position_embeddings") or context)
    max_len = lane.max_model_len or min(context, DEFAULT_MAX_LEN)
    kv = lane.kv_cache_memory_bytes
    if kv == "auto":
        one = max_len * kv_bytes_per_token(raw_config, lane.dtype)
        kv = max(one, min(lane.max_num_seqs * one, DEFAULT_KV_CACHE_BYTES))
    return {"max_model_len": max_len, "kv_cache_memory_bytes": kv}


def kv_bytes_per_token(raw_config: dict[str, Any], dtype: str) -> int:
    """Bytes one token's keys and values take in every layer (``dtype: auto``: the checkpoint's)."""
    if dtype == "auto":
        dtype = str(raw_config.get("torch_dtype") or raw_config.get("dtype") or "float32")
    try:
        config = ModelConfig.from_dict(raw_config)
        layers, kv_heads, head_dim = config.num_layers, config.num_kv_heads, config.head_dim
    except ValueError:  # a family only vLLM runs: read the usual fields
        text = raw_config.get("text_config", raw_config)
        heads = text["num_attention_heads"]
        layers, kv_heads = text["num_hidden_layers"], text.get("num_key_value_heads") or heads
        head_dim = text.get("head_dim") or text["hidden_size"] // heads
    return layers * 2 * kv_heads * head_dim * DTYPE_BYTES.get(dtype, 4)
