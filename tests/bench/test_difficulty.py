"""``bench.difficulty``: the router's score against each model's next-line hits, per quartile."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_quartiles_of_the_score(run_module):
    out = run_module("bench.difficulty", "--samples", 8, "--max-tokens", 64).splitlines()
    rows = [line.split() for line in out if line.startswith("Q")]
    assert [r[0] for r in rows] == ["Q1", "Q2", "Q3", "Q4"]
    lows, highs = zip(*(map(float, r[1].split("-")) for r in rows))
    assert all(lo <= hi for lo, hi in zip(lows, highs)) and list(lows) == sorted(lows)  # sorted by the score
    for r in rows:  # exact match of each model (%), then each model's loss on the true line (nats/token)
        assert all(0 <= float(x.rstrip("%")) <= 100 for x in r[2:4]) and all(float(x) > 0 for x in r[4:6])
