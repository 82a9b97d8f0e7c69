"""``bench.ttft_split``: a warm WebSocket first token split by the stream's own timestamps, on the shared app."""

from __future__ import annotations

import asyncio

import pytest

from bench.ttft_split import split

pytestmark = pytest.mark.slow


def test_the_parts_nest_inside_the_clients_first_token(app):
    a = app()
    doc = asyncio.run(split(a.base, "fast", 4, a.key))
    assert doc["lane"] == "fast" and doc["trials"] == 4
    p50 = {k: doc[k]["p50_ms"] for k in ("client_created", "client_first_delta", "router_ttft", "lane_engine_ttft")}
    assert all(0 < v < 60_000 for v in p50.values()) and all(doc[k]["min_ms"] <= p50[k] for k in p50)
    # the lane's interval lies inside the router's, the router's inside the client's (one machine)
    assert p50["lane_engine_ttft"] <= p50["router_ttft"] <= p50["client_first_delta"]
    assert doc["front_door_to_lane_and_back_p50_ms"] == pytest.approx(p50["router_ttft"] - p50["lane_engine_ttft"])
