"""The persistent WebSocket against the running application: many concurrent responses on one
connection, every bad-input class, auth, keepalive, and a disconnect freeing engine sequences."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bench.soak import cancelled
from tests.serve.conftest import text_of
from tests.serve.test_protocol import validate

LANES = {"fast": ("fastmode-fast", None), "priority": ("fastmode-full", "priority"),
         "standard": ("fastmode-full", "default")}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


def ws(a, key: str | None = "default", **kw):
    key = a.key if key == "default" else key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return connect(a.ws_url, additional_headers=headers, max_size=None, **kw)


async def collect(conn, ids: set[str]) -> dict[str, list[dict]]:
    """Every event of ``ids`` until each has ended (completed, cancelled or error)."""
    events, open_ = defaultdict(list), set(ids)
    while open_:
        e = json.loads(await conn.recv())
        validate(e)  # everything the server sends matches docs/protocol.schema.json
        events[e["id"]].append(e)
        if e["type"] in ("response.completed", "response.cancelled", "error"):
            open_.discard(e["id"])
    return events


def create(rid: str, lane: str = "fast", **kw) -> str:
    model, tier = LANES[lane]
    return json.dumps({"type": "response.create", "id": rid, "model": model, "service_tier": tier,
                       "input": "def main():\n", "max_output_tokens": 24, "temperature": 0, **kw})


@pytest.mark.slow
def test_each_lane_streams_the_same_text_as_http(app):
    a = app()

    async def main():
        async with ws(a) as conn:
            for lane in LANES:
                await conn.send(create(lane, lane))
            return await collect(conn, set(LANES))

    events = run(main())
    for lane in LANES:
        got = events[lane]
        assert got[0]["type"] == "response.created" and got[0]["lane"] == lane, got
        assert got[-1]["type"] == "response.completed" and got[-1]["usage"]["output_tokens"] == 24
        model, tier = LANES[lane]
        _, ref = a.generate(model=model, service_tier=tier, input="def main():\n", max_output_tokens=24,
                            temperature=0)
        assert "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta") == text_of(ref)


@pytest.mark.slow
def test_twenty_concurrent_streams_on_one_connection_lose_nothing(app):
    a = app()
    _, ref = a.generate(model="fastmode-fast", input="def main():\n", max_output_tokens=40, temperature=0)

    async def main():
        async with ws(a) as conn:
            ids = [f"r{i:02d}" for i in range(20)]
            for i, rid in enumerate(ids):
                await conn.send(create(rid, ["fast", "standard"][i % 2], max_output_tokens=40))
            return ids, await collect(conn, set(ids))

    ids, events = run(main())
    _, ref_full = a.generate(model="fastmode-full", input="def main():\n", max_output_tokens=40, temperature=0)
    for i, rid in enumerate(ids):
        got = events[rid]
        deltas = [e for e in got if e["type"] == "response.output_text.delta"]
        assert [d["seq"] for d in deltas] == list(range(len(deltas))), rid  # none lost, repeated or reordered
        assert got[-1]["type"] == "response.completed", got[-1]
        assert "".join(d["delta"] for d in deltas) == text_of(ref if i % 2 == 0 else ref_full)


BAD = [
    ("{oops", "invalid_json"),
    (json.dumps({"type": "response.fly", "id": "x"}), "unknown_event"),
    (json.dumps({"type": "response.create", "id": "t", "model": "fastmode-fast", "input": "x", "top_p": "hi"}),
     "invalid_request"),
    (json.dumps({"type": "response.create", "id": "r", "model": "fastmode-fast", "input": "x", "temperature": 9}),
     "invalid_request"),
    (json.dumps({"type": "response.create", "id": "m", "model": "nope", "input": "x"}), "unknown_model"),
    (json.dumps({"type": "response.create", "id": "s", "model": "fastmode-full", "service_tier": "flex",
                 "input": "x"}), "unknown_service_tier"),
    (b"\x00binary", "binary_frame"),
]


@pytest.mark.slow
@pytest.mark.parametrize("frame,code", BAD, ids=[c for _, c in BAD])
def test_bad_input_gets_a_coded_error_and_the_connection_serves_on(app, frame, code):
    a = app()

    async def main():
        async with ws(a) as conn:
            await conn.send(frame)
            error = json.loads(await conn.recv())
            await conn.send(create("after"))
            return error, await collect(conn, {"after"})

    error, after = run(main())
    assert error["type"] == "error" and error["code"] == code and error["message"], error
    assert after["after"][-1]["type"] == "response.completed"


@pytest.mark.slow
def test_duplicate_in_flight_id(app):
    a = app()

    async def main():
        async with ws(a) as conn:
            with a.paused("fast"):  # the first "dup" cannot end before the second arrives
                await conn.send(create("dup", max_output_tokens=200, ignore_eos=True))
                await conn.send(create("dup"))
                events = await collect(conn, {"dup"})  # the first "dup" to end: the duplicate's error
            rest = await collect(conn, {"dup"})
            return events["dup"], rest["dup"]

    first, rest = run(main())
    assert first[-1]["type"] == "error" and first[-1]["code"] == "duplicate_id"
    assert rest[-1]["type"] == "response.completed"


@pytest.mark.slow
def test_the_same_id_on_two_connections_is_two_requests(app):
    """Ids are the client's, unique per connection only; two connections sending "same" at once used to
    give the engines one request id twice."""
    a = app()

    async def one(lane: str):
        async with ws(a) as conn:
            await conn.send(create("same", lane, max_output_tokens=24, ignore_eos=True))
            return (await collect(conn, {"same"}))["same"]

    async def main():
        return await asyncio.gather(*(one(lane) for lane in ("fast", "fast", "standard", "standard")))

    results = asyncio.run(asyncio.wait_for(main(), 60))  # with one lane request id, one of them never ended
    for lane, events in zip(("fast", "fast", "standard", "standard"), results, strict=True):
        assert events[-1]["type"] == "response.completed" and events[-1]["usage"]["output_tokens"] == 24, events[-1]
        model, tier = LANES[lane]
        _, ref = a.generate(model=model, service_tier=tier, input="def main():\n", max_output_tokens=24,
                            temperature=0, ignore_eos=True)
        assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == text_of(ref)


@pytest.mark.slow
def test_an_oversized_frame_closes_with_1009_and_the_gateway_serves_on(app):
    a = app()

    async def main():
        async with ws(a) as conn:
            await conn.send(create("big", input="x" * (2**20 + 10)))
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await conn.recv()
            return closed.value.rcvd.code

    assert run(main()) == 1009
    status, events = a.generate(model="fastmode-fast", input="x = 1\n", max_output_tokens=2)
    assert status == 200 and events[-1]["type"] == "done"


@pytest.mark.slow
@pytest.mark.parametrize("key", [None, "sk-wrong"])
def test_a_missing_or_wrong_key_closes_with_1008_and_http_says_401(app, key):
    a = app()

    async def main():
        async with ws(a, key=key) as conn:
            with pytest.raises(ConnectionClosed) as closed:
                await conn.recv()
            return closed.value.rcvd.code

    assert run(main()) == 1008
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = a.client.post("/v1/generate", json={"model": "fastmode-fast", "input": "x"},
                      headers=headers | ({} if key else {"Authorization": ""}))
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert a.client.get("/health", headers={"Authorization": ""}).status_code == 200  # probes need no key


@pytest.mark.slow
def test_keepalive_ping_is_answered(app):
    a = app()

    async def main():
        async with ws(a) as conn:
            pong = await conn.ping()
            return await asyncio.wait_for(pong, 10)

    assert run(main()) >= 0  # the round trip's latency in seconds


async def _vanish(a, lane: str, rid: str) -> None:
    """A client that vanishes mid-stream (no close handshake) while ``lane``'s engine is stopped: back
    once the disconnect has reached that engine."""
    conn = await ws(a)
    await conn.send(create(rid, lane, max_output_tokens=400, ignore_eos=True))
    while json.loads(await conn.recv())["type"] != "response.output_text.delta":
        pass
    with a.paused(lane) as engine:
        conn.transport.abort()
        engine.reached_engine()


def _freed(a, lane: str, before: int) -> None:
    """``lane`` holds no sequence and has counted one more cancelled than ``before``."""
    deadline = time.monotonic() + 30
    while (s := a.lane_stats(lane))["running"] or s["in_flight"]:
        assert time.monotonic() < deadline, s
        time.sleep(0.2)
    assert cancelled(s) == before + 1, s


@pytest.mark.slow
def test_cancel_and_disconnect_free_the_engine_sequences(app):
    """``response.cancel``, then a client that vanishes, each while the fast lane's head is stopped (so
    the stream cannot end before the cancel reaches it): each frees its sequence."""
    a = app()
    before = cancelled(a.lane_stats("fast"))

    async def cancel():
        async with ws(a) as conn:
            await conn.send(create("c1", "fast", max_output_tokens=400, ignore_eos=True))
            while json.loads(await conn.recv())["type"] != "response.output_text.delta":
                pass
            with a.paused("fast") as fast:
                await conn.send(json.dumps({"type": "response.cancel", "id": "c1"}))
                ended = (await collect(conn, {"c1"}))["c1"][-1]
                fast.reached_engine()
        return ended

    assert run(cancel())["type"] == "response.cancelled"
    _freed(a, "fast", before)
    run(_vanish(a, "fast", "d1"))
    _freed(a, "fast", before + 1)


@pytest.mark.full  # about 50 s on 2 cores: the abort reaches the stopped vLLM engine only after that long
def test_a_vanished_client_frees_its_sequence_on_a_vllm_lane(app):
    a = app()
    before = cancelled(a.lane_stats("standard"))
    run(_vanish(a, "standard", "d2"))
    _freed(a, "standard", before)
