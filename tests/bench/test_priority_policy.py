"""``bench.priority_policy``: vLLM's own request priority on one engine, probes beside a background."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_probes_of_both_priorities_beside_the_background(tmp_path, run_module):
    out = tmp_path / "policy.json"
    run_module("bench.priority_policy", "--background", 2, "--tokens", 8, "--probes", 1, "--json", out)
    doc = json.loads(out.read_text())
    assert len(doc["probe"]) == 2
    for probe in doc["probe"].values():
        assert probe["n"] == 1 and probe["ttft_s"] > 0 and probe["decode_tokens_per_s"] > 0
    assert doc["background"]["n"] >= 2 and doc["background"]["decode_tokens_per_s"] > 0
    assert doc["settings"]["scheduling_policy"] == "priority" and doc["settings"]["background_streams"] == 2
