"""``fastmode bench quality --quick`` against the running application: it runs, and what it
measures through the lanes agrees with what it computes independently."""

from __future__ import annotations

import json

import pytest

from bench.quality import LANES, pareto


def test_pareto_frontier():
    pts = {"a": (10.0, 0.05), "b": (20.0, 0.03), "c": (15.0, 0.02), "d": (20.0, 0.03)}
    assert pareto(pts) == ["a", "b", "d"]  # c is beaten by b on both axes; b and d tie


@pytest.mark.slow
def test_quality_quick(quick_run):
    tmp_path = quick_run[0]
    result = json.loads((tmp_path / "quality.json").read_text())
    lanes = result["lanes"]
    # exact is skipped where the server has no such tier; every other lane answers.
    assert {"standard", "priority", "fast", "auto"} <= set(lanes)
    assert set(lanes) | set(result["skipped_lanes"]) == set(LANES)
    for name, lane in lanes.items():
        assert lane["requests"] == 16 and 0 <= lane["exact_match"] <= 1 and lane["bits_per_byte"] > 0, name
        lo, hi = lane["exact_match_ci95"]
        assert lo <= lane["exact_match"] <= hi
    # Standard and priority serve the same weights greedily on the same engine: the same answers and
    # likelihoods. exact serves the full model's greedy output through another engine (tests/serve
    # checks its tokens); here its bits per byte are the full checkpoint's by construction.
    assert lanes["standard"]["exact_match"] == lanes["priority"]["exact_match"]
    for name in {"priority", "exact"} & set(lanes):
        assert lanes[name]["bits_per_byte"] == lanes["standard"]["bits_per_byte"], name
    assert lanes["standard"]["bits_per_byte"] < lanes["fast"]["bits_per_byte"]
    assert set(lanes["auto"]["served_by"]) <= {"fast", "standard", "priority", "exact"}
    assert result["pareto_frontier"] and (tmp_path / "quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = (tmp_path / "quality_samples.jsonl").read_text().splitlines()
    assert len(records) == 16 and result["auto_policies"] and result["auto_policy_frontier"]
