"""``fastmode bench decode`` (``bench.decode``): the executor's batch-1 decode against llama-bench and
vLLM, and the profile of a token's time. Its smoke run is the suite's quick one (``quick_run``)."""

from __future__ import annotations

import json

import pytest

from bench.report import decode_section

pytestmark = pytest.mark.slow


def test_quick_run_measures_and_profiles_the_test_pairs_full_model(quick_run):
    import torch
    from transformers import AutoModelForCausalLM

    from models import TEST_FULL

    out, _ = quick_run
    doc = json.loads((out / "decode.json").read_text())
    assert doc["model"] == TEST_FULL.name and doc["settings"]["compiled"] is False
    assert len(doc["fastmode_tokens_per_s"]) == 1 and doc["fastmode_tokens_per_s"][0] > 0
    # llama.cpp cannot convert the test pair's tokenizer (or is not built here): skipped, with the reason
    assert "llama.cpp" in doc["skipped"] and doc["ratio_median"] is None and doc["llama_bench_tokens_per_s"] == []
    p = doc["profile"]
    assert sum(p["per_token_ms"].values()) == pytest.approx(p["step_ms"], rel=1e-6)
    assert p["per_token_ms"]["layers' linears"] > 0 and p["per_token_ms"]["head (vocab x hidden)"] > 0
    # every linear streams its weights once per token, as bfloat16: transformers' own count of them
    ref = AutoModelForCausalLM.from_pretrained(TEST_FULL)
    linears = {id(m.weight): m.weight.numel() for m in ref.modules() if isinstance(m, torch.nn.Linear)}
    assert p["weight_bytes_per_token"] == 2 * sum(linears.values())
    assert p["head_macs_per_token"] == ref.config.vocab_size * ref.config.hidden_size


def test_report_section_shows_the_ratio_the_goal_and_the_profile():
    doc = {"command": "fastmode bench decode", "date": "2026-12-03 00:00 UTC", "model": "smollm2",
           "settings": {"threads": 2, "tokens": 128, "rounds": 3, "compiled": True},
           "fastmode_start_s": 80.0, "gguf": {"tensor_types": {"BF16": 211, "F32": 61}}, "skipped": {},
           "fastmode_tokens_per_s": [60.0, 66.0, 65.0], "llama_bench_tokens_per_s": [74.0, 73.0, 75.0],
           "ratio_median": 65.0 / 74.0,
           "profile": {"tokens": 128, "step_ms": 10.0, "weight_bytes_per_token": 268959744, "linears_gb_per_s": 22.4,
                       "head_macs_per_token": 28311552,
                       "per_token_ms": {"layers' linears": 6.0, "head (vocab x hidden)": 2.0, "sampling": 2.0}},
           "vllm": {"per_user_tokens_per_s_p50": 42.3}}
    text = "\n".join(decode_section(doc))
    assert "fastmode / llama-bench: **0.88x** (target >= 1.0x: **no**)" in text
    assert "| fastmode executor | 65.0 | 60.0, 66.0, 65.0 |" in text and "| llama-bench | 74.0 |" in text
    assert "vLLM engine" in text and "42.3" in text and "211 BF16, 61 F32" in text
    assert "| layers' linears | 6.00 | 60% |" in text and "28.3M multiply-adds" in text
    assert decode_section(None)[-2] == "Not run (`fastmode bench decode`)."
    assert "did not include `decode`" in decode_section(None, {"stages": {"sharding": {}}})[-2]
