"""Smoke test of ``fastmode bench lanes --quick`` against the shared running application."""

from __future__ import annotations

import json
import math

import pytest

from bench.lanes import LANES, headline

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("api", ["websocket", "openai"])
def test_lanes_under_load_quick(quick_run, api):
    tmp_path = quick_run[0]
    stem = "lanes_load" if api == "websocket" else "lanes_load_openai"
    doc = json.loads((tmp_path / f"{stem}.json").read_text())
    assert doc["command"].startswith("fastmode bench lanes") and "--quick" in doc["command"]
    assert doc["settings"]["api"] == api
    assert doc["machine"]["cpu_count"] >= 1
    assert set(doc["lanes"]) == set(LANES)
    for lane, rows in doc["lanes"].items():
        assert [r["concurrency"] for r in rows] == [1, 2], lane
        for r in rows:
            assert r["completed"] == r["concurrency"] and not r["errors"], r
            assert r["output_tokens"] == 16 * r["completed"]
            if api == "websocket":  # the WebSocket names the lane that served: never spilled
                assert r["lanes_served"] == [lane]
            for value in (r["aggregate_tokens_per_s"], r["per_user_decode_tokens_per_s"]["p50"],
                          r["per_user_decode_tokens_per_s"]["p10"], r["ttft_s"]["p50"], r["ttft_s"]["p99"],
                          r["chip_seconds_per_1k_output_tokens"]):
                assert value is not None and math.isfinite(value) and value > 0, (lane, r)
            if api == "websocket":  # the OpenAI API carries no cost units
                assert r["cost_units_per_1k_output_tokens"] > 0
    # the fast lane's chips are the layout the server reports it deployed (/health), one replica each
    layout = doc["assumptions"]["fast_layout"]
    assert set(layout) == {"tp", "pp"} and all(isinstance(v, int) and v >= 1 for v in layout.values())
    assert doc["assumptions"]["chips"] == {"fast": layout["tp"] * layout["pp"], "priority": 1, "standard": 1, "exact": 1}
    # the server's price model: priority 6x standard per token
    pri, std = doc["lanes"]["priority"][0], doc["lanes"]["standard"][0]
    if api == "websocket":
        assert pri["cost_units_per_1k_output_tokens"] == pytest.approx(6 * std["cost_units_per_1k_output_tokens"])
    head = doc["headline"]
    assert head["standard_saturating_concurrency"] in (1, 2)
    for key in ("priority_per_user_speed_ratio", "priority_cost_ratio", "fast_per_user_speed_ratio"):
        assert math.isfinite(head[key]) and head[key] > 0, key
    assert head["published"] == {"priority_per_user_speed": 2.5, "priority_cost": 6.0, "fast_per_user_speed": 15.0}
    png = (tmp_path / f"{stem}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_the_chat_workload_through_both_front_doors(app):
    """``bench.targets``' chat requests on fastmode itself: the OpenAI chat API (SSE deltas) and the
    WebSocket (a message list), every requested token counted, on a full-model and the fast lane."""
    import asyncio

    import httpx

    from bench.targets import openai_request, websocket_request
    from clients.sdk import AsyncClient

    a = app()

    async def go():
        async with httpx.AsyncClient(base_url=a.base, headers={"Authorization": f"Bearer {a.key}"},
                                     timeout=120) as http:
            over_http = await openai_request(http, "fastmode-full", None, 6, "chat")
        async with AsyncClient(a.base, api_key=a.key) as client:
            over_ws = await websocket_request(client, "fastmode-fast", None, 6, "chat")
        return over_http, over_ws

    for r in asyncio.run(go()):
        assert r["output_tokens"] == 6 and r["chunks"] >= 1 and r["first"] >= r["sent"], r


def _row(lane, c, agg, user, chip_s, units):
    return {"lane": lane, "concurrency": c, "aggregate_tokens_per_s": agg, "chip_seconds_per_1k_output_tokens": chip_s,
            "per_user_decode_tokens_per_s": {"p50": user}, "cost_units_per_1k_output_tokens": units}


def test_headline_ratios():
    """Standard saturates where its aggregate is highest; priority and fast speeds at the lowest level."""
    results = {"standard": [_row("standard", 1, 100, 100, 10, 1), _row("standard", 4, 300, 75, 3.3, 1),
                            _row("standard", 16, 250, 16, 4, 1)],
               "priority": [_row("priority", 1, 110, 110, 9, 6), _row("priority", 4, 150, 75, 6.6, 6)],
               "fast": [_row("fast", 1, 90, 150, 22, 1), _row("fast", 4, 200, 50, 10, 1)]}
    h = headline(results)
    assert h["standard_saturating_concurrency"] == 4
    assert h["priority_per_user_speed_ratio"] == pytest.approx(110 / 75)
    assert h["priority_saturating_concurrency"] == 4
    assert h["priority_cost_ratio"] == pytest.approx(6.6 / 3.3)
    assert h["priority_price_ratio"] == pytest.approx(6)
    assert h["fast_per_user_speed_ratio"] == pytest.approx(2)
    assert h["fast_per_user_speed_ratio_at_equal_load"] == pytest.approx(50 / 75)


def test_low_concurrency_levels_complete_enough_requests_for_a_median():
    from bench.lanes import MIN_REQUESTS_PER_LEVEL, per_stream_at

    for level in (1, 4, 8, 16, 32):
        n = per_stream_at(level, 3, MIN_REQUESTS_PER_LEVEL)
        assert n >= 3 and level * n >= MIN_REQUESTS_PER_LEVEL and level * (n - 1) < max(MIN_REQUESTS_PER_LEVEL, 3 * level)
    assert per_stream_at(1, 1, 0) == 1  # --quick: as asked
