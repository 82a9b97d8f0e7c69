"""``bench.ttft_idle``: the fast lane's first token after the ring has idled, split by the head's stamps."""

from __future__ import annotations

import json

import pytest

from bench import ttft_idle


@pytest.mark.slow
def test_each_gap_is_timed_and_split(tmp_path):
    out = tmp_path / "idle.json"
    assert ttft_idle.main(["--no-compile", "--gaps", "0,3", "--rounds", "2", "--per-block", "2", "--json", out]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["p50_ms_by_gap_s"]) == {"0.0", "0.003"}
    for row in doc["p50_ms_by_gap_s"].values():
        assert 0 < row["first_token"] < 60_000
        assert 0 < row["step_compute"] <= row["step"]
        # the head's stamps fall inside the client's send -> first output (one machine, one clock)
        assert row["send_to_step"] + row["step"] + row["step_end_to_client"] <= row["first_token"] + 0.5
    assert doc["tokens"] == 4 and doc["rounds"] == 2
