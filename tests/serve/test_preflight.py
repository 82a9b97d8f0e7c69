"""``fastmode up`` checks every model against every lane before Ray starts: exit 2, a typed message."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from models import TEST_FAST, TEST_FULL
from serve import up
from serve.config import load_config
from serve.preflight import PROBES, PreflightError, estimate, preflight
from tests.sharding.families import save_family


@pytest.fixture
def no_start(monkeypatch):
    """``up.run`` (what starts Ray and the engines) records that it was reached instead of starting."""
    calls = []
    monkeypatch.setattr(up, "run", lambda *a, **k: calls.append(a) or 0)
    return calls


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(path: Path, **fields) -> Path:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **fields}))
    return path


def _fails(capsys, no_start, argv: list[str], message: str) -> str:
    # the test pair unless argv names another model (a later --full/--fast wins)
    assert up.main(["--full", str(TEST_FULL), "--fast", str(TEST_FAST), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not no_start  # nothing started
    return err


def test_the_shipped_pair_passes(no_start):
    preflight(load_config(None), chips=2)
    parts = estimate(load_config(None))
    assert set(parts) == {"lanes.fast", "router", "lanes.priority", "lanes.standard", "lanes.exact"}
    assert parts["lanes.exact"] > parts["lanes.priority"] > parts["lanes.fast"] > 0


def test_the_shipped_student_by_path_passes(no_start):
    # a student folder (weights beside the full model's) named by path, as a user passes their own
    from models import DEFAULT_FAST

    config = load_config({"models": {"fast": {"id": "fastmode-fast", "path": str(DEFAULT_FAST)}},
                          "lanes": {"fast": {"vocab": None}}})
    preflight(config, chips=2)
    assert up.main(["--fast", str(DEFAULT_FAST)]) == 0 and len(no_start) == 1


def test_a_pair_of_another_family_passes(tmp_path):
    """Qwen2-shaped full and fast models (biases on q/k/v) with the shipped tokenizer."""
    paths = []
    for name, layers in (("full", 2), ("fast", 1)):
        p = save_family("qwen2", tmp_path / name, num_hidden_layers=layers, vocab_size=4096)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(TEST_FAST / f, p / f)
        paths.append(p)
    preflight(load_config({"models": {"full": {"id": "f", "path": str(paths[0])},
                                      "fast": {"id": "s", "path": str(paths[1])}}}), chips=2)


def test_unsupported_model_type(tmp_path, capsys, no_start):
    fast = _edit_config(_copy(TEST_FAST, tmp_path / "gpt2"), model_type="gpt2")
    err = _fails(capsys, no_start, ["--fast", str(fast)], "models.fast.path: model_type 'gpt2' is not supported")
    assert "needed by the fast lane" in err


def test_unknown_tensor(tmp_path, capsys, no_start):
    fast = _copy(TEST_FAST, tmp_path / "extra")
    tensors = load_file(fast / "model.safetensors")
    save_file({**tensors, "model.layers.0.mlp.up_proj.bias": torch.zeros(352)}, fast / "model.safetensors")
    _fails(capsys, no_start, ["--fast", str(fast)], "does not use: 'model.layers.0.mlp.up_proj.bias'")


def test_missing_tensor(tmp_path, capsys, no_start):
    full = _copy(TEST_FULL, tmp_path / "missing")
    tensors = load_file(full / "model.safetensors")
    del tensors["model.layers.3.self_attn.v_proj.weight"]
    save_file(tensors, full / "model.safetensors")
    err = _fails(capsys, no_start, ["--full", str(full)], "models.full.path: checkpoint")
    assert "has no tensor 'model.layers.3.self_attn.v_proj.weight'" in err and "exact lane" in err


def test_quantized_config(tmp_path, capsys, no_start):
    fast = _edit_config(_copy(TEST_FAST, tmp_path / "fp8"), quantization_config={"quant_method": "fp8"})
    _fails(capsys, no_start, ["--fast", str(fast)], "quantization_config: 'fp8' checkpoints are not supported")


def test_tokenizers_that_differ(tmp_path, capsys, no_start):
    """Same size, two entries swapped: the exact tier would verify drafts of other tokens."""
    fast = _copy(TEST_FAST, tmp_path / "swapped")
    tok = json.loads((fast / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    first = Tokenizer.from_file(str(TEST_FAST / "tokenizer.json")).encode(PROBES[1]).ids[1]  # a token the probe uses
    a, b = by_id[first], by_id[first + 1]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (fast / "tokenizer.json").write_text(json.dumps(tok))
    _fails(capsys, no_start, ["--fast", str(fast)], "the exact lane and auto need the same tokenizer")


def test_tp_that_cannot_split(tmp_path, capsys, no_start):
    config = tmp_path / "tp3.yaml"
    config.write_text(f"models:\n  fast: {{id: fast, path: {TEST_FAST}}}\n  full: {{id: full, path: {TEST_FULL}}}\n"
                      "lanes:\n  fast: {tp: 3, pp: 1}\n")
    _fails(capsys, no_start, ["--config", str(config)], "lanes.fast.tp/pp: tensor parallel size 3 does not divide")


def test_weights_that_do_not_fit_the_machine():
    with pytest.raises(PreflightError, match=r"the weights alone take .* of this machine's 0.0 GiB") as info:
        preflight(load_config(None), memory_bytes=10 << 20)
    assert info.value.code == "preflight_failed"


def test_a_pruned_draft_head_needs_the_fast_models_token_counts(tmp_path):
    fast = _copy(TEST_FAST, tmp_path / "fast")
    config = {"models": {"full": {"id": "f", "path": str(TEST_FULL)}, "fast": {"id": "s", "path": str(fast)}},
              "lanes": {"exact": {"draft_vocab": 1024}}}
    with pytest.raises(PreflightError, match="lanes.exact.draft_vocab: .*token_counts.json does not exist"):
        preflight(load_config(config), chips=2)
    (fast / "token_counts.json").write_text('{"tokens": 2, "counts": [[5, 2]]}')
    preflight(load_config(config), chips=2)


def test_a_cut_fast_lane_vocabulary_needs_token_counts_and_one_chip_a_stage(tmp_path):
    fast = _copy(TEST_FAST, tmp_path / "fast")
    models = {"full": {"id": "f", "path": str(TEST_FULL)}, "fast": {"id": "s", "path": str(fast)}}
    config = {"models": models, "lanes": {"fast": {"vocab": 256}}}
    with pytest.raises(PreflightError, match="lanes.fast.vocab: .*token_counts.json does not exist"):
        preflight(load_config(config), chips=2)
    (fast / "token_counts.json").write_text('{"tokens": 2, "counts": [[5, 2]]}')
    preflight(load_config(config), chips=2)
    tp2 = {"models": models, "lanes": {"fast": {"vocab": 256, "tp": 2, "pp": 1}}}
    with pytest.raises(PreflightError, match=r"lanes.fast.vocab: .*tp: 1\), got tp: 2"):
        preflight(load_config(tp2), chips=2)
