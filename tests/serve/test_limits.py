"""Per-connection limits against the running application (``gateway`` in the config, defaults):
frames a second per WebSocket, WebSocket connections per API key, and the deadline on each HTTP
request's head that keeps slowloris clients from holding the gateway. ``max_in_flight`` and the
frame budget's arithmetic are tested in process (``test_websocket_session.py``), the head limits'
edge cases too (``test_listen.py``)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from websockets.exceptions import ConnectionClosed

from serve.config import GatewayConfig
from tests.serve.test_listen import trickle
from tests.serve.test_websocket import collect, create, ws

LIMITS = GatewayConfig()


def run(coro, timeout_s: float = 120):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def served(conn) -> bool:
    """Whether ``conn`` still handles frames (a cancel of an unknown id is answered at once)."""
    await conn.send(json.dumps({"type": "response.cancel", "id": "probe"}))
    while True:
        e = json.loads(await asyncio.wait_for(conn.recv(), 30))
        if e.get("id") == "probe":
            return e["code"] == "unknown_id"


@pytest.mark.slow
def test_a_client_over_the_frame_rate_is_told_when_to_retry_and_one_that_sends_on_is_closed(app):
    a = app()

    async def polite():
        """Sends in batches of 50 until one is refused, waits as told, then is served on the same connection."""
        async with ws(a) as conn:
            sent, refused = 0, None
            while refused is None:
                for _ in range(50):
                    await conn.send(json.dumps({"type": "response.cancel", "id": f"c{sent}"}))
                    sent += 1
                for _ in range(50):  # every frame answered: the last refusal names the whole debt
                    e = json.loads(await conn.recv())
                    refused = e if e["code"] == "rate_limited" else refused
            await asyncio.sleep(refused["retry_after"])
            await conn.send(create("after", max_output_tokens=2))
            return sent, refused, (await collect(conn, {"after"}))["after"][-1]

    async def flooding():
        """Sends on regardless: refused, then closed."""
        async with ws(a, max_queue=None) as conn:
            codes: list[str] = []

            async def read():
                try:
                    while True:
                        codes.append(json.loads(await conn.recv())["code"])
                except ConnectionClosed as closed:
                    return closed.rcvd

            reader = asyncio.ensure_future(read())
            try:
                for n in range(20 * LIMITS.frame_burst):
                    await conn.send(json.dumps({"type": "response.cancel", "id": f"f{n}"}))
            except ConnectionClosed:
                pass
            return codes, await reader

    sent, error, after = run(polite())
    assert sent > LIMITS.frame_burst and error["id"].startswith("c") and 0 < error["retry_after"] < 1, error
    assert after["type"] == "response.completed"
    codes, close = run(flooding())
    assert "rate_limited" in codes and codes[-1] == "rate_limited"
    assert (close.code, close.reason) == (1008, "frame rate limit exceeded")
    assert run(_fresh_connection_serves(a))


async def _fresh_connection_serves(a) -> bool:
    async with ws(a) as conn:
        return await served(conn)


@pytest.mark.slow
def test_an_api_key_holds_at_most_its_connections_per_replica(app):
    a = app()
    limit = LIMITS.max_connections_per_key
    deadline = time.monotonic() + 30
    while a.health()[1]["websocket_connections"]:  # earlier tests' connections have closed
        assert time.monotonic() < deadline, a.health()[1]["websocket_connections"]
        time.sleep(0.2)

    async def main():
        conns = []
        try:
            for _ in range(limit):
                conns.append(await ws(a))
            assert await served(conns[-1])  # every one counted by now
            extra = await ws(a)
            error = json.loads(await extra.recv())
            with pytest.raises(ConnectionClosed) as closed:
                await extra.recv()
            async with ws(a, key="sk-other") as other:  # another key is not affected
                other_served = await served(other)
            await conns.pop().close()
            await asyncio.sleep(0.5)  # the server sees the close
            async with ws(a) as again:  # room for one again
                again_served = await served(again)
            return error, closed.value.rcvd, other_served, again_served
        finally:
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    error, close, other_served, again_served = run(main())
    assert error["type"] == "error" and error["code"] == "too_many_connections" and error["id"] is None
    assert close.code == 1008 and "too many connections" in close.reason and str(limit) in close.reason
    assert other_served and again_served


@pytest.mark.slow
def test_fifty_slowloris_connections_do_not_hold_the_gateway(app):
    """Fifty clients open TCP and trickle a WebSocket upgrade's headers, a byte at a time, never ending
    them: every other client is served meanwhile, and the gateway cuts each of them off (408) at
    ``header_timeout_s``."""
    a = app()

    async def main():
        stop = asyncio.Event()
        slow = [asyncio.ensure_future(trickle(a.port, stop, "/v1/responses", every_s=1.0)) for _ in range(50)]
        await asyncio.sleep(1.0)
        start = time.monotonic()
        health = await asyncio.to_thread(a.health)
        status, events = await asyncio.to_thread(a.generate, model="fastmode-fast", input="x = 1\n",
                                                 max_output_tokens=2)
        async with ws(a) as conn:
            await conn.send(create("w", max_output_tokens=2))
            streamed = (await collect(conn, {"w"}))["w"][-1]
        others_s = time.monotonic() - start
        still_open = sum(not s.done() for s in slow)
        try:
            results = await asyncio.wait_for(asyncio.gather(*slow), LIMITS.header_timeout_s + 20)
        finally:
            stop.set()
        return health[0], status, events[-1], streamed, others_s, still_open, results

    health, status, done, streamed, others_s, still_open, results = run(main())
    assert health == 200 and status == 200 and done["type"] == "done"
    assert streamed["type"] == "response.completed"
    assert still_open == 50 and others_s < LIMITS.header_timeout_s  # served while all fifty were open
    for got, after in results:
        assert got.startswith(b"HTTP/1.1 408") or got == b"reset", got
        assert LIMITS.header_timeout_s - 1 < after < LIMITS.header_timeout_s + 10, after


@pytest.mark.slow
def test_the_gateway_refuses_a_body_over_its_cap_and_keeps_serving(app):
    """``max_body_bytes`` on the running gateway: an OpenAI request declaring a body over the cap is
    answered 413 before any of it is sent; the next request is served."""
    a = app()

    async def main():
        reader, writer = await asyncio.open_connection("127.0.0.1", a.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (LIMITS.max_body_bytes + 1))
        got = await asyncio.wait_for(reader.read(), 30)  # the answer, then the server's close
        writer.close()
        return got

    got = run(main())
    assert got.startswith(b"HTTP/1.1 413"), got
    status, events = a.generate(model="fastmode-fast", input="x = 1\n", max_output_tokens=2)
    assert status == 200 and events[-1]["type"] == "done"
