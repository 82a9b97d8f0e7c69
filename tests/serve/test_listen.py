"""The gateway's own HTTP server (``serve.listen``) in process: a slowloris client (partial requests,
trickled) holds nothing for long and blocks nobody; an oversized head is refused; slow bodies and
keep-alive connections are left alone."""

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


@api.post("/echo")
async def echo(request: Request) -> dict:
    return {"got": len(await request.body())}


@api.websocket("/ws")
async def ws_echo(ws: WebSocket) -> None:
    await ws.accept()
    await ws.send_text(await ws.receive_text())
    await ws.close()


def serving(script, header_timeout_s: float = 1.0, max_header_bytes: int = 4096):
    async def main():
        port = free_port()
        server, task = await listen(api, "127.0.0.1", port, ws_max_size=2**20, header_timeout_s=header_timeout_s,
                                    max_header_bytes=max_header_bytes)
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
