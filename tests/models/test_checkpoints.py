"""The shipped pair: standard Hugging Face checkpoints within the size rules, that generate."""

from __future__ import annotations

import json

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from models import TEST_FAST, TEST_FULL, MODELS_DIR
from models.recipe.export import CHECKPOINT_FILES, count_parameters
from tests.conftest import shipped


def test_checkpoint_files_and_total_size(shipped_model):
    for f in CHECKPOINT_FILES:
        assert (shipped_model / f).exists(), f
    cfg = json.loads((shipped_model / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"


def test_total_shipped_size_at_most_40_mb():
    total = sum(p.stat().st_size for d in (shipped(TEST_FULL), shipped(TEST_FAST)) for p in d.iterdir() if p.is_file())
    assert total <= 40 * 2**20, total


def test_parameter_budgets():
    full = LlamaForCausalLM.from_pretrained(shipped(TEST_FULL))
    fast = LlamaForCausalLM.from_pretrained(shipped(TEST_FAST))
    n_full, n_fast = count_parameters(full), count_parameters(fast)
    assert 5e6 <= n_full <= 25e6
    assert n_fast * 4 <= n_full
    assert fast.config.num_hidden_layers < full.config.num_hidden_layers
    assert fast.config.hidden_size < full.config.hidden_size


def test_generates_python(shipped_model):
    tok = AutoTokenizer.from_pretrained(shipped_model)
    model = LlamaForCausalLM.from_pretrained(shipped_model, dtype=torch.float32).eval()
    prompt = "import os\n\n\ndef "
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert len(out[0]) > ids.shape[1]
    # A code model that learned anything names the function it is defining and opens its arguments.
    assert "(" in text, text


def test_model_cards_record_the_run():
    shipped(TEST_FULL)
    readme = (MODELS_DIR / "test" / "README.md").read_text()
    for needle in ("parameters", "held-out", "sha256", "seed", "steps"):
        assert needle in readme
