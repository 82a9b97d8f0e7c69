"""Faults on the running application: a chip, an engine process or the gateway killed mid-stream.

The contract (docs/serving.md, "When a part dies"): a request streaming on the lane that lost its
engine gets an ``error`` event with the stable, retryable code ``lane_unavailable`` (and
``retry_after``) within 5 s; the lane rebuilds its engine in place (the replica, its links and the
application stay), and a new request is served within 30 s. A killed gateway's clients see the
connection drop, and the SDK reconnects and sends again what had produced no text yet.

Each process is killed with SIGKILL, found among the shared app's own descendants.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import psutil
import pytest
from websockets.sync.client import connect

from tests.serve.conftest import FIRST_REQUESTS

ERROR_WITHIN_S = 5.0
SERVED_AGAIN_WITHIN_S = 30.0


def descendants(app, mark: str, under: str | None = None) -> list[psutil.Process]:
    """The app's processes whose command line contains ``mark`` (below one containing ``under``)."""
    procs = psutil.Process(app.proc.pid).children(recursive=True)
    if under is not None:
        parents = [p for p in procs if under in " ".join(p.cmdline())]
        procs = [c for p in parents for c in p.children(recursive=True)]
    return [p for p in procs if mark in " ".join(p.cmdline())]


def stream_until_first_delta(app, lane: str):
    ws = connect(app.ws_url, additional_headers={"Authorization": f"Bearer {app.key}"}, max_size=None)
    ws.send(json.dumps({"type": "response.create", "id": "long", "input": "def main():\n", "temperature": 0,
                        "max_output_tokens": 4000 if lane == "fast" else 2000, "ignore_eos": True,
                        **FIRST_REQUESTS[lane]}))
    while True:
        event = json.loads(ws.recv(timeout=120))
        assert event["type"] != "error", event
        if event["type"] == "response.output_text.delta":
            return ws


def error_after_kill(ws) -> tuple[dict, float]:
    """The stream's end after its engine was killed, and how long it took to come."""
    t0 = time.perf_counter()
    while True:
        event = json.loads(ws.recv(timeout=60))
        if event["type"] in ("error", "response.completed"):
            return event, time.perf_counter() - t0


def served_again(app, lane: str) -> tuple[float, list[str]]:
    """Seconds until a new request on ``lane`` completes (retrying while the lane says
    ``lane_unavailable``), and the codes of the refusals meanwhile."""
    t0, refusals = time.perf_counter(), []
    while time.perf_counter() - t0 < 120:
        status, events = app.generate(input="x = 1\n", max_output_tokens=4, temperature=0, **FIRST_REQUESTS[lane])
        last = events[-1]
        if last["type"] == "done":
            return time.perf_counter() - t0, refusals
        refusals.append(last.get("code") or last.get("error", {}).get("code"))
        assert refusals[-1] == "lane_unavailable", (status, events)
        time.sleep(0.5)
    raise AssertionError(f"the {lane} lane did not serve again within 120 s: {refusals[-3:]}")


def check_contract(app, lane: str, kill) -> None:
    ws = stream_until_first_delta(app, lane)
    try:
        kill()
        event, took = error_after_kill(ws)
    finally:
        ws.close()
    assert event["type"] == "error" and event["code"] == "lane_unavailable", event
    assert event.get("retry_after", 0) > 0, event
    assert took < ERROR_WITHIN_S, f"the error came {took:.1f} s after the kill"
    again, refusals = served_again(app, lane)
    assert again < SERVED_AGAIN_WITHIN_S, f"served again only after {again:.1f} s ({len(refusals)} refusals)"
    stats = app.lane_stats(lane)
    assert stats["rebuilds"] and stats["rebuilds"][-1]["ok"] and not stats["rebuilding"], stats["rebuilds"]
    assert stats["running"] == 0 and stats["in_flight"] == 0, stats


@pytest.mark.slow
def test_a_fast_lane_chip_killed_mid_stream_errors_then_the_lane_rebuilds(app):
    a = app()
    chips = descendants(a, "ray::ChipWorker")
    assert chips, "no chip actor found"
    check_contract(a, "fast", lambda: chips[-1].send_signal(signal.SIGKILL))


@pytest.mark.slow
def test_a_vllm_engine_killed_mid_stream_errors_then_the_lane_rebuilds(app):
    a = app()
    engines = descendants(a, "VLLM::EngineCore", under="ServeReplica:fastmode:standard-lane")
    assert len(engines) == 1, engines
    check_contract(a, "standard", lambda: engines[0].send_signal(signal.SIGKILL))


@pytest.mark.slow
def test_a_killed_gateway_comes_back_and_the_sdk_reconnects(app):
    from clients.sdk import AsyncClient, ConnectionLost

    a = app()

    async def main():
        async with AsyncClient(f"ws://127.0.0.1:{a.port}", api_key=a.key, backoff_initial_s=0.1) as client:
            await client.responses.create(model="fastmode-fast", input="x = 1\n", max_output_tokens=2)
            streaming = await client.responses.stream(model="fastmode-fast", input="def main():\n",
                                                      max_output_tokens=4000, ignore_eos=True)
            async for _ in streaming:
                break
            [gateway] = descendants(a, "ServeReplica:fastmode:gateway")
            gateway.send_signal(signal.SIGKILL)
            t0 = time.perf_counter()
            with pytest.raises(ConnectionLost):  # it had streamed text: sending it again could repeat it
                async for _ in streaming:
                    pass
            # Sent on the dead connection or while the gateway restarts: the SDK reconnects and resends.
            after = await client.responses.create(model="fastmode-fast", input="x = 1\n", max_output_tokens=2)
            return after, time.perf_counter() - t0, client.connects

    after, took, connects = asyncio.run(main())
    assert after.finish_reason == "length" and after.usage.output_tokens == 2
    assert connects == 2, connects
    print(f"gateway back and serving {took:.1f} s after the kill")
    for _ in range(3):  # the test's HTTP client may still hold a connection to the killed gateway
        try:
            assert a.health()[0] == 200
            break
        except httpx.TransportError:
            time.sleep(0.5)
