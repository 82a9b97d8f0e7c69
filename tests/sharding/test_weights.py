"""Checkpoint loading: bf16 upcast, tied heads, pipeline stages, and clear errors on bad checkpoints."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from sharding.errors import CheckpointError
from sharding.weights import load_model


def test_whole_model_equals_checkpoint_upcast(tiny_dir):
    path = tiny_dir / "full"
    model = load_model(path)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        for name, param in model.named_parameters():
            stored = f.get_tensor(name)
            assert stored.dtype == torch.bfloat16 and param.dtype == torch.float32
            assert torch.equal(param, stored.float()), name
    assert {n for n, _ in model.named_parameters()} == names


def test_tied_head_shares_the_embedding(tiny_dir):
    model = load_model(tiny_dir / "fast")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    # The last stage of a tied model owns no embedding: its head loads the embedding's tensor.
    last = load_model(tiny_dir / "fast", layer_range=(1, 2))
    assert last.model.embed_tokens is None
    assert torch.equal(last.lm_head.weight, model.model.embed_tokens.weight)


def test_stage_holds_only_its_layers(tiny_dir):
    first = load_model(tiny_dir / "full", layer_range=(0, 1))
    names = {n for n, _ in first.named_parameters()}
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert "model.norm.weight" not in names and not any(n.startswith("model.layers.1.") for n in names)
    middle = load_model(tiny_dir / "full", layer_range=(1, 1), has_head=True)
    assert {n for n, _ in middle.named_parameters()} == {"model.norm.weight", "lm_head.weight"}


def test_missing_and_misshapen_tensors(tiny_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_dir / "full", bad)
    tensors = load_file(bad / "model.safetensors")
    up = tensors.pop("model.layers.1.mlp.up_proj.weight")
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.layers.1.mlp.up_proj.weight") as info:
        load_model(bad)
    assert info.value.code == "bad_checkpoint"
    load_model(bad, layer_range=(0, 1))  # a stage without layer 1 does not need it
    tensors["model.layers.1.mlp.up_proj.weight"] = up[:-1]
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(CheckpointError, match=rf"up_proj.weight.*\({up.shape[0] - 1}, {up.shape[1]}\)"):
        load_model(bad)
