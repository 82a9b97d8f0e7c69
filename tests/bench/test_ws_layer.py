"""``bench.ws_layer``: the WebSocket layer's own round trip, per uvicorn implementation, alternated."""

from __future__ import annotations

import json
import statistics

from bench import ws_layer


def test_each_implementation_is_timed_in_alternated_blocks(tmp_path):
    out = tmp_path / "ws.json"
    assert ws_layer.main(["--rounds", "3", "--per-block", "5", "--json", out]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["samples_s"]) == {"websockets-sansio", "websockets"}
    for impl, xs in doc["samples_s"].items():
        assert len(xs) == 10 and all(0 < x < 10 for x in xs)  # every request got its delta (warm-up left out)
        assert doc["p50_ms"][impl] == statistics.median(xs) * 1e3
