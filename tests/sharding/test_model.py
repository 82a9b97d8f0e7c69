"""The plain-torch Llama against transformers: prompt logits, pipeline stages, llama3 RoPE, padding."""

from __future__ import annotations

import pytest
import torch

from sharding.config import ModelConfig
from sharding.errors import InvalidLayout
from sharding.kv_cache import KVCache
from sharding.model import Llama
from sharding.rope import rope_inv_freq
from sharding.weights import load_model

from .conftest import hf_logits, hf_model, prompt_ids, save_random_llama

TOL = 1e-4


@torch.inference_mode()
def prefill_logits(stages: list[Llama], ids: list[int], slot: int = 0) -> torch.Tensor:
    """Logits ``[S, V]`` of one prompt run through ``stages`` in order, each with a fresh cache."""
    x = torch.tensor([ids])
    positions = torch.arange(len(ids))[None]
    for m in stages:
        x = m(x, positions, torch.tensor([slot]), KVCache.for_model(m, num_slots=slot + 1))
    return stages[-1].compute_logits(x)[0]


def test_prompt_logits_match_transformers(checkpoint):
    ids = prompt_ids(checkpoint, 48)
    ours = prefill_logits([load_model(checkpoint)], ids)
    assert (ours - hf_logits(checkpoint, ids)).abs().max().item() <= TOL


@torch.inference_mode()
def test_pipeline_stages_match_whole_model(checkpoint):
    """Two stages (layer halves) handing hidden states over match the whole model, prefill and decode."""
    whole = load_model(checkpoint)
    n = whole.config.num_layers
    first = load_model(checkpoint, layer_range=(0, n // 2))
    last = load_model(checkpoint, layer_range=(n // 2, n))
    assert first.has_embedding and not first.has_head and last.has_head and not last.has_embedding
    assert not any(k.startswith(f"model.layers.{n // 2}.") for k, _ in first.named_parameters())
    caches = [KVCache.for_model(m, num_slots=2) for m in (whole, first, last)]
    ids = prompt_ids(checkpoint, 20)
    x, positions, slot = torch.tensor([ids]), torch.arange(len(ids))[None], torch.tensor([1])
    for _ in range(4):  # prefill, then three decode steps fed with the whole model's greedy token
        ref = whole.compute_logits(whole(x, positions, slot, caches[0]))
        staged = last.compute_logits(last(first(x, positions, slot, caches[1]), positions, slot, caches[2]))
        assert (staged - ref).abs().max().item() <= 1e-5
        x, positions = ref[:, -1:].argmax(-1), positions[:, -1:] + 1
    assert (prefill_logits([first, last], ids) - hf_logits(checkpoint, ids)).abs().max().item() <= TOL


@torch.inference_mode()
def test_padded_batch_prefill_matches_single(tiny_dir):
    """Rows of different lengths, right-padded at continuing positions, give each row's own logits."""
    path = tiny_dir / "full"
    model = load_model(path)
    prompts = [prompt_ids(path, 9, seed=1), prompt_ids(path, 23, seed=2), prompt_ids(path, 16, seed=3)]
    width = max(map(len, prompts))
    tokens = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    cache = KVCache.for_model(model, num_slots=4)
    logits = model.compute_logits(model(tokens, torch.arange(width).expand(3, width), torch.tensor([3, 0, 2]),
                                        cache))
    for row, p in enumerate(prompts):
        assert (logits[row, : len(p)] - prefill_logits([model], p)).abs().max().item() <= 1e-5


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    """A random model with Llama-3.x RoPE scaling; theta 1e4 and head_dim 16 put wavelengths in
    all three bands (kept, blended, scaled) of the original 32-token context."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
    path = save_random_llama(tmp_path / "llama3", tie_word_embeddings=False, max_position_embeddings=256,
                             rope_theta=10000.0, rope_scaling=scaling)
    config = ModelConfig.from_pretrained(path)
    assert config.rope_scaling is not None and config.rope_scaling.factor == 8.0
    assert torch.equal(rope_inv_freq(config)[0], hf_model(path).model.rotary_emb.inv_freq)
    ids = prompt_ids(path, 200)
    assert (prefill_logits([load_model(path)], ids) - hf_logits(path, ids)).abs().max().item() <= TOL


def test_bad_layer_range(tiny_dir):
    config = ModelConfig.from_pretrained(tiny_dir / "full")
    with pytest.raises(InvalidLayout, match="layer_range"):
        Llama(config, layer_range=(1, 3))
    with pytest.raises(InvalidLayout, match="head"):
        Llama(config, layer_range=(0, 1)).compute_logits(torch.zeros(1, config.hidden_size))
