"""``bench.tracing_cost``: the fast lane's engine with tracing off and on, in a tiny setting."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_off_and_on_alternate_and_the_traced_requests_export_spans(tmp_path, run_module):
    out = tmp_path / "tracing.json"
    run_module("bench.tracing_cost", "--tokens", 8, "--pairs", 2, "--pp", 2, "--no-compile", "--json", out)
    doc = json.loads(out.read_text())
    assert doc["layout"] == {"tp": 1, "pp": 2, "transport": doc["layout"]["transport"], "compile": False}
    assert len(doc["runs"]["off"]) == len(doc["runs"]["on"]) == 2 and all(x > 0 for x in doc["runs"]["off"] + doc["runs"]["on"])
    assert doc["slowdown"] == pytest.approx(1 - doc["tokens_per_s"]["on"] / doc["tokens_per_s"]["off"])
    assert doc["spans_exported"] > 0  # the warm-up and the traced requests: their step and hop spans
