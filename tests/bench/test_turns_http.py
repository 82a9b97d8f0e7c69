"""``bench.turns.http_conversation``: each turn re-sends the whole history on a new connection, from
one client per conversation (its set-up is not charged to every turn)."""

from __future__ import annotations

import asyncio
import json

import httpx

from bench.turns import fresh_connections, http_conversation


class ChatServer:
    """A bare HTTP/1.1 server of streamed chat completions that keeps every connection open (as
    uvicorn does) and records each connection and each request's messages."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[list[dict]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                body = json.loads(await reader.readexactly(length))
                self.requests.append(body["messages"])
                n = len(self.requests)
                events = [{"choices": [{"delta": {"content": f"reply{n}"}}]},
                          {"choices": [], "usage": {"prompt_tokens": 3 * n,
                                                    "prompt_tokens_details": {"cached_tokens": n}}}]
                payload = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                data = payload.encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             + f"content-length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def serving(server: ChatServer):
    s = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    return s, f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}"


def test_each_turn_resends_the_history_on_a_new_connection_from_one_client(monkeypatch):
    built = []

    class Counted(httpx.AsyncClient):
        def __init__(self, *args, **kwargs) -> None:
            built.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(httpx, "AsyncClient", Counted)

    async def main():
        server = ChatServer()
        s, url = await serving(server)
        async with s:
            turns = await http_conversation(url, None, "fast", ["a", "b", "c"], tokens=4)
        return server, turns

    server, turns = asyncio.run(main())
    assert server.connections == 3 and len(built) == 1
    assert server.requests == [
        [{"role": "user", "content": "a"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "reply1"}, {"role": "user", "content": "b"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "reply1"}, {"role": "user", "content": "b"},
         {"role": "assistant", "content": "reply2"}, {"role": "user", "content": "c"}],
    ]
    assert [t["cached_tokens"] for t in turns] == [1, 2, 3]
    assert [t["input_tokens"] for t in turns] == [3, 6, 9]
    assert all(0 < t["ttft_s"] <= t["total_s"] for t in turns)


def test_fresh_connections_keeps_none_alive_where_a_default_client_would():
    async def count(client_of) -> int:
        server = ChatServer()
        s, url = await serving(server)
        async with s, client_of(url) as client:
            for _ in range(3):
                r = await client.post("/v1/chat/completions", json={"messages": []})
                r.raise_for_status()
        return server.connections

    assert asyncio.run(count(lambda url: fresh_connections(url, {}))) == 3
    assert asyncio.run(count(lambda url: httpx.AsyncClient(base_url=url))) == 1
