"""Tiny random-weight checkpoints of each supported family, built with transformers' own classes.

Nothing is downloaded: each family's config class makes a two- or three-layer model of the same
small shape (vocabulary 320, width 64, 4 query and 2 key/value heads of 16), with the family's
features switched on where they are optional (a sliding window shorter than the test prompts,
Gemma's final soft-capping, Phi-3's partial rotary and longrope) so the parity tests exercise
them. Norm weights and biases, which transformers initialises to constants, are drawn at random
too, so a norm or bias applied wrongly changes the logits.
"""

from __future__ import annotations

from pathlib import Path

import torch

SHAPE = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128, bos_token_id=0, eos_token_id=1,
             pad_token_id=2, initializer_range=0.2)
"""Shared by every family (larger than the usual 0.02 init so greedy choices are not near-ties)."""


def _configs():
    from transformers import (Gemma3TextConfig, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config,
                              Qwen3Config)

    half = SHAPE["head_dim"] // 2  # rotary frequencies of a full rotary head
    return {
        "llama": lambda **o: LlamaConfig(**{**SHAPE, "tie_word_embeddings": True, **o}),
        "qwen2": lambda **o: Qwen2Config(**{**SHAPE, "tie_word_embeddings": False, **o}),
        "qwen3": lambda **o: Qwen3Config(**{**SHAPE, "tie_word_embeddings": True, **o}),
        "mistral": lambda **o: MistralConfig(**{**SHAPE, "sliding_window": 8, "tie_word_embeddings": False, **o}),
        "gemma3_text": lambda **o: Gemma3TextConfig(**{
            **SHAPE, "num_hidden_layers": 3, "sliding_window": 8, "query_pre_attn_scalar": 24,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"][:o.get("num_hidden_layers", 3)],
            "final_logit_softcapping": 30.0, **o}),
        "phi3": lambda **o: Phi3Config(**{
            **SHAPE, "tie_word_embeddings": False, "original_max_position_embeddings": 64,
            "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                "short_factor": [1.0 + 0.1 * i for i in range(half // 2)],
                                "long_factor": [2.0 + 0.2 * i for i in range(half // 2)],
                                "original_max_position_embeddings": 64},
            **o}),
    }


FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text", "phi3")


def save_family(name: str, out: Path, seed: int = 0, **overrides) -> Path:
    """Save a seeded random fp32 checkpoint of family ``name`` at ``out`` (``overrides``: config fields)."""
    from transformers import AutoModelForCausalLM

    config = _configs()[name](**overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    return out
