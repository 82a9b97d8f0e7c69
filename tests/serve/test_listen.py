"""The gateway's own HTTP server (``serve.listen``) in process: a slowloris client (partial requests,
trickled) holds nothing for long and blocks nobody; an oversized head is refused; a body is given
its own deadline and size cap, within which slow bodies and keep-alive connections are left alone."""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import FastAPI, Request, WebSocket
from websockets.asyncio.client import connect

from bench.app import free_port
from serve.listen import listen

api = FastAPI()


@api.get("/ping")
async def ping() -> dict:
    return {"ok": True}


echoed: list[int] = []
"""The body sizes /echo has read: a refused body must never reach the app."""


@api.post("/echo")
async def echo(request: Request) -> dict:
    echoed.append(len(await request.body()))
    return {"got": echoed[-1]}


@api.websocket("/ws")
async def ws_echo(ws: WebSocket) -> None:
    await ws.accept()
    await ws.send_text(await ws.receive_text())
    await ws.close()


def serving(script, header_timeout_s: float = 1.0, max_header_bytes: int = 4096, **body_limits):
    async def main():
        port = free_port()
        server, task = await listen(api, "127.0.0.1", port, ws_max_size=2**20, header_timeout_s=header_timeout_s,
                                    max_header_bytes=max_header_bytes, **body_limits)
        try:
            return await asyncio.wait_for(script(port), 60)
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)

    return asyncio.run(main())


async def get(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    data = await reader.read()  # to the server's close
    writer.close()
    return data


async def trickle(port: int, stop: asyncio.Event, path: str = "/ws", every_s: float = 0.2) -> tuple[bytes, float]:
    """A slowloris client: an upgrade's request line, then a header byte every ``every_s``, never the
    end. Returns what the server answered and when (seconds after connecting)."""
    start = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Slow: ".encode())
    answer = asyncio.ensure_future(reader.read())
    while not answer.done() and not stop.is_set():
        writer.write(b"a")
        await asyncio.wait([answer], timeout=every_s)
    try:
        got = await answer if answer.done() else b""
    except ConnectionResetError:  # closed while a byte of ours was in flight: the 408 may be lost
        got = b"reset"
    writer.close()
    return got, time.monotonic() - start


def test_slow_partial_requests_block_no_one_and_are_cut_off_at_the_head_timeout():
    async def script(port):
        stop = asyncio.Event()
        slow = [asyncio.ensure_future(trickle(port, stop)) for _ in range(50)]
        await asyncio.sleep(0.3)  # all 50 connected and trickling
        served = await get(port, b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        async with connect(f"ws://127.0.0.1:{port}/ws") as conn:
            await conn.send("hi")
            echoed = await conn.recv()
        answered_while_slow = not any(s.done() for s in slow)
        results = await asyncio.gather(*slow)
        stop.set()
        return served, echoed, answered_while_slow, results

    served, echoed, answered_while_slow, results = serving(script, header_timeout_s=2.0)
    assert served.startswith(b"HTTP/1.1 200") and json.loads(served.split(b"\r\n\r\n")[1]) == {"ok": True}
    assert echoed == "hi" and answered_while_slow
    for got, after in results:
        assert (got.startswith(b"HTTP/1.1 408") or got == b"reset") and 1.9 < after < 4, (got, after)


def test_a_connection_that_sends_nothing_is_closed_too():
    async def script(port):
        reader, _ = await asyncio.open_connection("127.0.0.1", port)
        return await reader.read()

    assert serving(script).startswith(b"HTTP/1.1 408")


def test_an_oversized_head_is_431():
    async def script(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\n")
        for _ in range(10):  # 1000 header bytes at a time, no end in sight, until the server answers
            writer.write(b"X-Big: " + b"a" * 991 + b"\r\n")
            try:
                return await asyncio.wait_for(reader.read(), 0.1)
            except TimeoutError:
                pass
        return b"no answer"

    assert serving(script, max_header_bytes=4096).startswith(b"HTTP/1.1 431")


def test_a_slow_body_and_a_later_keep_alive_request_are_not_cut():
    async def script(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
        await asyncio.sleep(1.5)  # past the head timeout: only the head is timed
        writer.write(b"cd")
        first = await reader.readuntil(b'{"got":4}')
        await asyncio.sleep(0.5)  # idle between requests: uvicorn's keep-alive (5 s) governs that
        writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        second = await reader.read()
        writer.close()
        return first, second

    first, second = serving(script, header_timeout_s=1.0)
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")


def test_a_body_trickled_past_its_deadline_is_408_and_never_reaches_the_app():
    async def script(port):
        start = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        answer = asyncio.ensure_future(reader.read())
        while not answer.done():  # a byte every 0.1 s: the head in time, the body never
            writer.write(b"a")
            await asyncio.wait([answer], timeout=0.1)
        writer.close()
        return answer.result(), time.monotonic() - start

    before = len(echoed)
    got, after = serving(script, header_timeout_s=5.0, body_timeout_s=1.0)
    assert got.startswith(b"HTTP/1.1 408") and 0.9 < after < 3, (got, after)
    assert len(echoed) == before


def test_a_body_over_the_cap_is_413_declared_or_chunked_and_one_at_the_cap_is_served():
    cap = 10_000

    async def script(port):
        declared = await get(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (cap + 1))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunked = b""
        for _ in range(20):  # 1000-byte chunks, no end, until the server answers
            writer.write(b"3e8\r\n" + b"a" * 1000 + b"\r\n")
            try:
                chunked = await asyncio.wait_for(reader.read(), 0.1)
                break
            except TimeoutError:
                pass
        writer.close()
        at_cap = await get(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                 b"Content-Length: %d\r\n\r\n" % cap + b"a" * cap)
        return declared, chunked, at_cap

    before = len(echoed)
    declared, chunked, at_cap = serving(script, max_body_bytes=cap)
    assert declared.startswith(b"HTTP/1.1 413") and chunked.startswith(b"HTTP/1.1 413"), (declared, chunked)
    assert at_cap.startswith(b"HTTP/1.1 200") and json.loads(at_cap.split(b"\r\n\r\n")[1]) == {"got": cap}
    assert echoed[before:] == [cap]  # neither refused body reached the app


def test_a_keep_alive_connections_next_head_is_timed_too():
    async def script(port):
        start = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await reader.readuntil(b'{"ok":true}')
        writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\n")  # the second request's head never ends
        second = await reader.read()
        writer.close()
        return first, second, time.monotonic() - start

    first, second, after = serving(script, header_timeout_s=1.0)
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 408") and after < 3, (second, after)
