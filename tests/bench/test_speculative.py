"""``fastmode bench speculative``: fastmode's executor plain and speculative, in a tiny setting; greedy
speculative decoding must give the plain engine's output token for token."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_ours_plain_fixed_and_adaptive(tmp_path, run_module):
    out = tmp_path / "speculative.json"
    run_module("bench.speculative", "--only-ours", "--no-packed", "--no-compile", "--ks", 2, "--tokens", 12,
               "--prompts", 1, "--repeats", 1, "--json", out)
    doc = json.loads(out.read_text())
    assert doc["settings"]["compile"] is False
    results = doc["results"]
    assert [(r["worker"], "error" in r) for r in results] == [("ours:0:fixed", False), ("ours:2:fixed", False),
                                                             ("ours:2:adaptive", False)]
    for r in results:
        assert r["identical_to_plain"] and r["tokens_per_s_p50"] > 0
    for r in results[1:]:
        assert 0 <= r["acceptance"] <= 1 and 1 <= r["tokens_per_verify"] <= 3
