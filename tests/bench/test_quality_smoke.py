"""``fastmode bench quality --quick`` against the running application: it runs, and what it
measures through the lanes agrees with what it computes independently."""

from __future__ import annotations

import json

import pytest

from bench.quality import pareto


def test_pareto_frontier():
    pts = {"a": (10.0, 0.05), "b": (20.0, 0.03), "c": (15.0, 0.02), "d": (20.0, 0.03)}
    assert pareto(pts) == ["a", "b", "d"]  # c is beaten by b on both axes; b and d tie


@pytest.mark.slow
def test_quality_quick(quick_run):
    tmp_path = quick_run[0]
    result = json.loads((tmp_path / "quality.json").read_text())
    lanes = result["lanes"]
    assert set(lanes) == {"standard", "priority", "fast", "auto"}
    for name, lane in lanes.items():
        assert lane["requests"] == 16 and 0 <= lane["exact_match"] <= 1 and lane["bits_per_byte"] > 0, name
    # Standard and priority serve the same weights greedily: the same answers and likelihoods.
    assert lanes["standard"]["exact_match"] == lanes["priority"]["exact_match"]
    assert lanes["standard"]["bits_per_byte"] == lanes["priority"]["bits_per_byte"]
    assert lanes["standard"]["bits_per_byte"] < lanes["fast"]["bits_per_byte"]
    assert set(lanes["auto"]["served_by"]) <= {"fast", "standard"}
    assert result["pareto_frontier"] and (tmp_path / "quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
