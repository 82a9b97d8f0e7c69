"""Every supported family against transformers: logits, stages, RoPE types, the exact tier, the ring.

Each family's checkpoint is a tiny random model built by transformers' own config and model classes
(``tests/sharding/families.py``); the references are transformers' ``forward`` and ``generate``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load_file, save_file

from sharding.config import ModelConfig
from sharding.errors import CheckpointError, InvalidConfig
from sharding.kv_cache import KVCache
from sharding.pipeline import ShardedModel
from sharding.placement import stage_layers
from sharding.rope import rope_inv_freq
from sharding.sampling import SamplingParams
from sharding.speculative import SpeculativeEngine
from sharding.weights import load_model

from .families import FAMILIES, save_family

TOL = 1e-4
LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]
# make test runs each family on one layout (every layout is covered by some family, and the
# three-layer Gemma 3 model splits unevenly); make test-all runs every family on every layout.
QUICK = {"llama": (2, 2), "qwen2": (2, 1), "qwen3": (1, 2), "mistral": (1, 1), "gemma3_text": (1, 2),
         "phi3": (2, 1)}


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("families")
    for name in FAMILIES:
        save_family(name, root / name)
        save_family(name, root / f"{name}-draft", seed=1, num_hidden_layers=1)
    return root


@functools.cache
def hf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def ids_of(length: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [0] + torch.randint(3, 320, (length - 1,), generator=g).tolist()


@torch.no_grad()
def hf_logits(path: Path, ids: list[int]) -> torch.Tensor:
    return hf(path)(torch.tensor([ids])).logits[0]


@torch.no_grad()
def hf_greedy(path: Path, ids: list[int], n: int) -> list[int]:
    """Exactly ``n`` greedy tokens from transformers' forward, eos included as any token (our ``ignore_eos``;
    ``generate``'s ``min_new_tokens`` would instead forbid eos). Checked against ``generate`` itself up to
    the first eos in ``test_greedy_reference_is_generate``."""
    seq = list(ids)
    for _ in range(n):
        seq.append(int(hf(path)(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]


@torch.inference_mode()
def staged_logits(path: Path, ids: list[int], pp: int) -> torch.Tensor:
    config = ModelConfig.from_pretrained(path)
    x, positions, slot = torch.tensor([ids]), torch.arange(len(ids))[None], torch.tensor([0])
    stages = [load_model(path, layer_range=r) for r in stage_layers(config, 1, pp)]
    for m in stages:
        x = m(x, positions, slot, KVCache.for_model(m, num_slots=1))
    return stages[-1].compute_logits(x)[0]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pp", [1, 2])
def test_prompt_logits_match_transformers(family_dir, family, pp):
    """40 tokens: longer than the sliding windows (8) and than Phi-3's rotary base context needs."""
    path = family_dir / family
    ids = ids_of(40)
    assert (staged_logits(path, ids, pp) - hf_logits(path, ids)).abs().max().item() <= TOL


def test_config_reads_each_family(family_dir):
    got = {name: ModelConfig.from_pretrained(family_dir / name) for name in FAMILIES}
    assert got["qwen2"].qkv_bias and not got["qwen2"].o_bias
    assert got["qwen3"].qk_norm and not got["qwen3"].qkv_bias
    assert got["mistral"].sliding_window == 8 and set(got["mistral"].layer_types) == {"sliding_attention"}
    g = got["gemma3_text"]
    assert (g.norm_offset, g.embed_scale, g.sandwich_norm, g.attn_scale) == (1.0, 8.0, True, 24 ** -0.5)
    assert g.local_rope_theta is not None and g.local_rope_theta != g.rope_theta and g.hidden_act == "gelu_pytorch_tanh"
    assert got["phi3"].fused_projections and got["phi3"].rotary_dim == 8 and got["phi3"].context == 64
    assert stage_layers(g, 1, 2) == [(0, 2), (2, 3)]  # three layers, two stages: uneven


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 16, "mscale": 0.7,
     "mscale_all_dim": 1.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 32},
], ids=lambda s: s["rope_type"] + ("-mscale" if "mscale" in s else ""))
def test_rope_types_match_transformers(tmp_path, scaling):
    path = save_family("llama", tmp_path / "m", rope_parameters={"rope_theta": 10000.0, **scaling})
    ours, factor = rope_inv_freq(ModelConfig.from_pretrained(path))
    ref = hf(path).model.rotary_emb
    assert torch.allclose(ours, ref.inv_freq, rtol=1e-6) and factor == pytest.approx(ref.attention_scaling)
    ids = ids_of(100)
    assert (staged_logits(path, ids, 1) - hf_logits(path, ids)).abs().max().item() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_reference_is_generate(family_dir, family):
    path, ids = family_dir / family, ids_of(24)
    out = hf(path).generate(torch.tensor([ids]), do_sample=False, max_new_tokens=32, pad_token_id=2)[0, 24:].tolist()
    assert hf_greedy(path, ids, len(out)) == out


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_tier_is_the_full_models_greedy_output(family_dir, family):
    """A pair of the family (the draft: one layer, other weights) through the speculative engine."""
    full, draft = family_dir / family, family_dir / f"{family}-draft"
    engine = SpeculativeEngine.from_pretrained(full, draft, num_slots=2, k=3, adaptive=False)
    prompts = [ids_of(12, seed=1), ids_of(30, seed=2)]
    out = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert out == [hf_greedy(full, p, 24) for p in prompts]


# ---- strict loading: a checkpoint that does not match its config fails, naming the tensor --------

def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_a_tensor_nothing_reads_fails_the_load(family_dir, tmp_path):
    path = _copy(family_dir / "llama", tmp_path / "extra")
    tensors = load_file(path / "model.safetensors")
    save_file({**tensors, "model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}, path / "model.safetensors")
    with pytest.raises(CheckpointError, match="does not use: 'model.layers.0.self_attn.q_proj.bias'") as info:
        load_model(path)
    assert info.value.code == "bad_checkpoint"


def test_a_relabelled_config_fails_the_load(family_dir, tmp_path):
    """A Qwen2 checkpoint (q/k/v biases) whose config says llama would load and generate garbage."""
    path = _copy(family_dir / "qwen2", tmp_path / "relabelled")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(CheckpointError, match=r"q_proj\.bias"):
        load_model(path)


def test_a_missing_tensor_fails_the_load(family_dir, tmp_path):
    path = _copy(family_dir / "qwen3", tmp_path / "missing")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match="no tensor 'model.layers.1.self_attn.k_norm.weight'"):
        load_model(path)


def test_a_quantized_checkpoint_is_refused(family_dir, tmp_path):
    path = _copy(family_dir / "mistral", tmp_path / "fp8")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(InvalidConfig, match="quantization_config: 'fp8'"):
        load_model(path)


# ---- the ring the fast lane runs ------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", resources={"chip": 4}, num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _ring_params():
    for family in FAMILIES:
        for tp, pp in LAYOUTS:
            marks = [] if QUICK[family] == (tp, pp) else [pytest.mark.full]
            yield pytest.param(family, tp, pp, marks=marks, id=f"{family}-tp{tp}-pp{pp}")


@pytest.mark.parametrize("family, tp, pp", list(_ring_params()))
def test_ring_greedy_32_tokens_match_transformers(ray_cluster, family_dir, family, tp, pp):
    path = family_dir / family
    ids = ids_of(24)
    with ShardedModel.from_pretrained(path, tp=tp, pp=pp, num_slots=2) as model:
        assert (model.prompt_logits(ids) - hf_logits(path, ids)).abs().max().item() <= TOL
        assert model.generate([ids], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0] == \
            hf_greedy(path, ids, 32)


def test_a_131k_llama3_checkpoint_starts_with_defaults(ray_cluster, tmp_path):
    """A Llama 3.x-shaped config keeps 131,072 positions and llama3 RoPE scaling; the ring starts with
    default settings (its cache sized by DEFAULT_MAX_LEN, not the context) and decodes as transformers."""
    from sharding.kv_cache import DEFAULT_MAX_LEN

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    path = save_family("llama", tmp_path / "llama31", max_position_embeddings=131072, rope_parameters=rope)
    ids = ids_of(24)
    with ShardedModel.from_pretrained(path) as model:
        assert model.max_len == DEFAULT_MAX_LEN
        assert model.generate([ids], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0] == \
            hf_greedy(path, ids, 16)
