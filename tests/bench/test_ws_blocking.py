"""``bench.ws_blocking``: the blocking WebSocket client that times first tokens, against
``websockets``' own asyncio server."""

from __future__ import annotations

import asyncio
import threading

import pytest
from websockets.asyncio.server import serve

from bench.ws_blocking import BlockingWebSocket


@pytest.fixture
def server():
    """``(url, seen)``: an echo server on loopback that answers each text message twice, records the
    upgrade's Authorization header, closes with 1000 on "bye", and pings the client first."""
    seen: dict = {}
    ready = threading.Event()
    loop = asyncio.new_event_loop()

    async def handler(conn):
        seen["authorization"] = conn.request.headers.get("Authorization")
        await conn.ping()
        async for msg in conn:
            if msg == "bye":
                await conn.close(1000, "bye")
                return
            await conn.send(msg)
            await conn.send(msg.upper())

    stop = loop.create_future()

    async def main():
        async with serve(handler, "127.0.0.1", 0) as s:
            seen["port"] = s.sockets[0].getsockname()[1]
            ready.set()
            await stop

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield f"ws://127.0.0.1:{seen['port']}/", seen
    loop.call_soon_threadsafe(stop.set_result, None)
    thread.join(10)
    loop.close()


def test_messages_go_and_come_in_order_and_headers_reach_the_server(server):
    url, seen = server
    with BlockingWebSocket(url, {"Authorization": "Bearer k"}) as conn:
        for text in ["a", "é€ unicode", "x" * 70_000]:  # one long enough for a 64-bit length
            conn.send(text)
            assert conn.recv() == text and conn.recv() == text.upper()
    assert seen["authorization"] == "Bearer k"


def test_a_close_from_the_server_is_an_error_not_a_hang(server):
    url, _ = server
    with BlockingWebSocket(url, timeout_s=10) as conn:
        conn.send("bye")
        with pytest.raises(ConnectionError):
            conn.recv()


def test_wss_is_refused_plainly():
    with pytest.raises(ValueError, match="wss"):
        BlockingWebSocket("wss://127.0.0.1:1/")
