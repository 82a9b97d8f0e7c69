"""``bench.headline``: the README's headline table is the published run's, computed, never typed."""

from __future__ import annotations

import json
import shutil

import pytest

from bench import headline
from bench.app import REPO


def test_the_readme_shows_the_published_runs_headline():
    """Whatever the README says between its markers is what ``bench/results`` computes to: a hand edit
    of a figure, or results published without ``bench.report --readme``, fails here."""
    text = (REPO / "README.md").read_text()
    block = text.split(headline.BEGIN + "\n", 1)[1].split(headline.END, 1)[0]
    assert block.rstrip("\n").splitlines() == headline.table(headline.rows(REPO / "bench/results"))


def test_rows_follow_the_results_and_read_each_figure_against_its_target(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(REPO / "bench/results", results)
    (results / "decode.json").write_text(json.dumps(
        {"ratio_median": 1.25, "fastmode_tokens_per_s": [80.0, 82.0, 81.0]}))
    rows = {r.what: r for r in headline.rows(results)}
    decode = rows["the executor's batch-1 decode of the full model in process"]
    assert decode.measured.startswith("1.25x llama.cpp's") and "(81 tokens/s)" in decode.measured
    assert decode.target == "1.0x (met)"
    (results / "decode.json").write_text(json.dumps({"ratio_median": 0.8, "fastmode_tokens_per_s": [40.0]}))
    assert {r.what: r for r in headline.rows(results)}[decode.what].target == "1.0x (**missed**)"

    lanes = json.loads((results / "lanes_load.json").read_text())
    ratio = lanes["headline"]["priority_per_user_speed_ratio"]
    priority = next(r for r in rows.values() if r.what.startswith("priority per user"))
    assert priority.measured.startswith(f"{ratio:.2f}x faster per user")
    assert priority.target.endswith("(met)" if ratio >= 2.5 else "(**missed**)")

    # a run without a stage has no row for it, rather than a guess
    for name in ("decode.json", "turns.json", "quality.json"):
        (results / name).unlink()
    left = [r.what for r in headline.rows(results)]
    assert not any("decode" in w or "turn" in w or "quality" in w or "auto" in w for w in left)
    assert any(w.startswith("fast lane per user") for w in left)
    assert headline.rows(tmp_path / "empty") == []


def test_update_readme_rewrites_only_its_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{headline.BEGIN}\nold | row\n{headline.END}\nafter\n")
    headline.update_readme(readme, ["| a | b | c |"])
    assert readme.read_text() == f"# x\n\nbefore\n{headline.BEGIN}\n| a | b | c |\n{headline.END}\nafter\n"
    readme.write_text("# x\nno markers\n")
    with pytest.raises(headline.MarkersMissing, match="no headline block"):
        headline.update_readme(readme, ["| a | b | c |"])
    assert readme.read_text() == "# x\nno markers\n"
