"""Lane links (``serve.lanes.lane_links``) in process: a ``LinkServer`` over a scripted ``generate``, and
the ``LaneLinks`` a router holds, over loopback TCP. The app-level tests (test_router, test_lanes,
test_websocket, ...) run every request of the served app over these links too."""

from __future__ import annotations

import asyncio

import pytest

from serve.errors import LaneUnavailable, Overloaded
from serve.lanes.lane_links import LaneLinks, LinkServer


class Scripted:
    """A lane replica's ``generate``: ``n`` deltas ``every_s`` apart, or a refusal; records closes."""

    def __init__(self, n: int = 3, every_s: float = 0.0, refuse: bool = False) -> None:
        self.n, self.every_s, self.refuse = n, every_s, refuse
        self.started, self.closed = [], []

    async def generate(self, request):
        self.started.append(request["id"])
        try:
            if self.refuse:
                raise Overloaded("the priority lane's batch is full (2 sequences)", retry_after=1.5)
            yield {"type": "accepted", "input_tokens": 3}
            for i in range(self.n):
                await asyncio.sleep(self.every_s)
                yield {"type": "delta", "seq": i, "text": f"t{i}", "tokens": 1}
            yield {"type": "done", "finish_reason": "length"}
        finally:
            self.closed.append(request["id"])


class Handle:
    """A lane's Serve handle as ``LaneLinks`` uses it: ``link_address.remote()``."""

    def __init__(self, *servers: LinkServer) -> None:
        self.servers, self.calls = servers, 0

    @property
    def link_address(self):
        return self

    async def remote(self):
        self.calls += 1
        return await self.servers[self.calls % len(self.servers)].address("127.0.0.1")


class HandleWithHead(Handle):
    """A fast lane's handle: each replica's address also names its ring's head (``serve.lanes.head_links``)."""

    async def remote(self):
        return {**await super().remote(), "head": {"host": "127.0.0.1", "port": 1}}


async def drain(stream) -> list[dict]:
    return [event async for event in stream]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def eventually(condition, timeout_s: float = 2.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)


def test_events_stream_in_order_and_many_requests_share_one_connection():
    async def main():
        lane = Scripted(n=5, every_s=0.001)
        links = LaneLinks(Handle(LinkServer(lane.generate)), replicas=1)
        streams = [(await links.open({"id": i}, set()))[1] for i in range(8)]
        results = await asyncio.gather(*(drain(s) for s in streams))
        assert len(links.conns) == 1
        for events in results:
            assert [e["type"] for e in events] == ["accepted"] + ["delta"] * 5 + ["done"]
            assert [e["seq"] for e in events if e["type"] == "delta"] == list(range(5))
        assert sorted(lane.closed) == list(range(8))
        links.close()
    run(main())


def test_a_refusal_arrives_as_the_lanes_typed_error():
    async def main():
        links = LaneLinks(Handle(LinkServer(Scripted(refuse=True).generate)), replicas=1)
        _, stream = await links.open({"id": "r"}, set())
        with pytest.raises(Overloaded) as e:
            await stream.__anext__()
        assert e.value.retry_after == 1.5 and e.value.code == "overloaded"
        links.close()
    run(main())


def test_cancel_closes_the_lanes_stream_and_the_connection_lives_on():
    async def main():
        lane = Scripted(n=10_000, every_s=0.001)
        links = LaneLinks(Handle(LinkServer(lane.generate)), replicas=1)
        _, stream = await links.open({"id": "a"}, set())
        assert (await stream.__anext__())["type"] == "accepted"
        await stream.__anext__()
        stream.cancel()
        await eventually(lambda: lane.closed)
        assert lane.closed == ["a"]  # the lane's generator was closed: its engine sequence is freed
        lane.n = 2
        _, again = await links.open({"id": "b"}, set())
        assert (await drain(again))[0]["type"] == "accepted"
        links.close()
    run(main())


def test_a_front_door_that_goes_away_frees_every_stream_it_had():
    async def main():
        lane = Scripted(n=10_000, every_s=0.001)
        links = LaneLinks(Handle(LinkServer(lane.generate)), replicas=1)
        streams = [(await links.open({"id": i}, set()))[1] for i in range(3)]
        for s in streams:
            await s.__anext__()
        links.close()  # the connection drops without a cancel for any stream
        await eventually(lambda: len(lane.closed) == 3)
        assert sorted(lane.closed) == [0, 1, 2]
    run(main())


def test_a_lane_replica_that_goes_away_ends_open_streams_with_lane_unavailable():
    async def main():
        server = LinkServer(Scripted(n=10_000, every_s=0.001).generate)
        links = LaneLinks(Handle(server), replicas=1)
        _, stream = await links.open({"id": "x"}, set())
        await stream.__anext__()
        [conn] = links.conns.values()
        server.close()
        conn.writer.transport.abort()  # as if the replica's process died
        with pytest.raises(LaneUnavailable):
            while True:
                await stream.__anext__()
    run(main())


def test_a_connection_without_the_secret_is_closed_unread():
    async def main():
        lane = Scripted()
        server = LinkServer(lane.generate)
        where = await server.address("127.0.0.1")
        reader, writer = await asyncio.open_connection(where["host"], where["port"])
        writer.write(b"\0" * len(where["secret"]))
        assert await reader.read() == b""  # closed by the replica
        assert lane.started == []
        server.close()
    run(main())


def test_requests_go_to_the_least_busy_replica_and_a_retry_to_another():
    async def main():
        a, b = Scripted(n=10_000, every_s=0.001), Scripted(n=10_000, every_s=0.001)
        links = LaneLinks(Handle(LinkServer(a.generate), LinkServer(b.generate)), replicas=2)
        first, s1 = await links.open({"id": 1}, set())
        second, s2 = await links.open({"id": 2}, set())
        assert len(links.conns) == 2 and first != second
        assert (await links.open({"id": 3}, {first, second})) is None  # every replica tried
        for s in (s1, s2):
            s.cancel()
        links.close()
    run(main())


def test_a_lane_without_links_leaves_the_router_on_its_handle():
    async def main():
        links = LaneLinks(object(), replicas=1)  # no link_address: an old or scripted lane
        assert await links.open({"id": 1}, set()) is None
    run(main())


def test_a_request_sent_after_a_cancel_finds_the_cancelled_streams_slot_free():
    class Capped(Scripted):  # one sequence at a time, as the priority lane's admission
        in_flight = 0

        async def generate(self, request):
            if self.in_flight >= 1:
                raise Overloaded("the batch is full (1 sequence)", retry_after=1.0)
            self.in_flight += 1
            try:
                async for event in super().generate(request):
                    yield event
            finally:
                await asyncio.sleep(0.01)  # an engine abort that takes a moment
                self.in_flight -= 1

    async def main():
        lane = Capped(n=10_000, every_s=0.001)
        links = LaneLinks(Handle(LinkServer(lane.generate)), replicas=1)
        _, first = await links.open({"id": "a"}, set())
        assert (await first.__anext__())["type"] == "accepted"
        first.cancel()
        lane.n = 1
        _, second = await links.open({"id": "b"}, set())  # right behind the cancel, on the same connection
        assert [e["type"] for e in await drain(second)] == ["accepted", "delta", "done"]
        links.close()
    run(main())


def test_a_head_link_that_cannot_open_leaves_requests_on_the_replicas_link():
    """The fast lane's head link (``serve.lanes.head_links``) failing to open, for whatever reason, is
    logged and the requests go over the replica's own link."""
    async def main():
        lane = Scripted(n=2)
        server = LinkServer(lane.generate)

        async def broken(replica, head):
            raise ValueError("no tokenizer here")

        links = LaneLinks(HandleWithHead(server), 1, head=broken)
        replica, stream = await links.open({"id": "a"}, set())
        events = await drain(stream)
        assert replica == server.replica and links.heads == {}
        assert [e["type"] for e in events] == ["accepted", "delta", "delta", "done"] and lane.started == ["a"]
        links.close()
        server.close()

    run(main())


def test_a_live_head_link_is_preferred_and_a_dead_one_falls_back_until_rediscovered():
    """Requests go to the replica's ring head while this front door's head link is up; once it is
    down (a ring rebuilt, say) they go over the replica's link, and the next discovery opens a new one."""
    class FakeHead:
        def __init__(self, n: int) -> None:
            self.n, self.alive, self.streams, self.started, self.closed = n, True, {}, [], False

        def start(self, request):
            self.started.append(request["id"])
            return f"head-{self.n}"

        def close(self) -> None:
            self.closed = True

    async def main():
        lane = Scripted(n=1)
        server = LinkServer(lane.generate)

        heads: list[FakeHead] = []

        async def open_head(replica, head):
            heads.append(FakeHead(len(heads)))
            return heads[-1]

        links = LaneLinks(HandleWithHead(server), 1, head=open_head)
        _, first = await links.open({"id": "a"}, set())
        assert first == "head-0" and heads[0].started == ["a"]
        heads[0].alive = False  # its ring failed
        _, second = await links.open({"id": "b"}, set())  # within REDISCOVER_S: the replica's link
        assert [e["type"] for e in await drain(second)] == ["accepted", "delta", "done"] and lane.started == ["b"]
        await links.connect()  # the next discovery
        _, third = await links.open({"id": "c"}, set())
        assert third == "head-1" and heads[0].closed and len(heads) == 2
        links.close()
        server.close()

    run(main())
