"""``bench.ttft_layers``: the fast lane's first token through each layer of a front door's path."""

from __future__ import annotations

import json
import math

import pytest

from bench import ttft_layers


@pytest.mark.slow
def test_each_layer_is_timed_in_alternated_blocks(tmp_path):
    out = tmp_path / "layers.json"
    assert ttft_layers.main(["--no-compile", "--rounds", "2", "--per-block", "2", "--json", out]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["samples_s"]) == {"blocking", "head_client", "lane", "lane_coalesced"}
    for name, xs in doc["samples_s"].items():
        assert len(xs) == 4 and all(0 < x < 60 for x in xs)  # every request gave a first token
        assert math.isclose(doc["p50_ms"][name], 1e3 * sorted(xs)[1] / 2 + 1e3 * sorted(xs)[2] / 2)
    assert doc["options"]["prefix_cache"] == "True" and doc["options"]["compile"] == "False"
