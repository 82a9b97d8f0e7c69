"""Lane links: a front door streams from a lane replica over one TCP connection, not a Serve call.

Why: a Ray Serve handle call costs a request milliseconds before its first item comes back: on
the fast lane, more than the lane replica's own share of a warm first token (tokenize, the ring's
prefill and first token; docs/front-doors.md). Each streamed chunk costs Serve CPU too, on both
sides. The fast lane's chips already talk over plain TCP links for the same reason.

So every lane replica also listens on a TCP port of its node (``LinkServer``), and each front
door's router keeps one connection per replica (``LaneLinks``), multiplexing its requests by a
connection-local id. Messages are ``sharding.transport`` frames (pickled, as Ray's are):

    front door ── ("gen", cid, LaneRequest) ──▶ lane replica     starts Lane.generate
               ◀── ("ev", cid, event) ────────                  accepted, delta chunks, done
               ◀── ("end", cid) | ("exc", cid, exception) ──    the stream's end (exactly one)
               ── ("cancel", cid) ────────────▶                 the caller went away: free the sequence

Ray Serve still owns the replicas (placement, health checks, restarts) and its handles carry
everything else (``stats``, discovery). A connection must open with the replica's 32-byte secret,
which only Ray's authenticated handle call hands out (``Lane.link_address``); anything else is
closed unread. When a connection breaks, its open streams end with ``lane_unavailable`` and the
next request discovers the replicas again; while no link can be had, the router uses the handle.

On the fast lane a front door goes one process further: it streams from the ring's head chip
itself, with a ``Lane`` of its own (``serve.lanes.head_links``); ``LaneLinks`` opens those head links
beside the replicas' links and prefers them while they are up.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sharding.errors import ShardingError
from sharding.transport import LinkClosed, frame, read_frame

from ..errors import FastmodeError, LaneUnavailable

log = logging.getLogger(__name__)
SECRET_BYTES = 32
HELLO_TIMEOUT_S = 10.0
CANCEL_WAIT_S = 1.0
"""Longest a connection's reader waits for a cancelled stream's cleanup before reading on."""
REDISCOVER_S = 5.0
"""How often a router may ask a lane for its replicas' links again while it has fewer than
``replicas`` (or none, falling back to Serve's handle meanwhile)."""


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` itself if it is one of ours (typed, picklable), else an internal error naming it."""
    if isinstance(exc, (FastmodeError, ShardingError)):
        return exc
    return FastmodeError(f"{type(exc).__name__}: {exc}")


class LinkServer:
    """The lane replica's side: serves ``generate(request)`` streams to the front doors' links.

    Args:
        generate: the replica's stream of events for one ``LaneRequest`` (``Lane.generate``).
    """

    def __init__(self, generate: Callable[[Any], AsyncIterator[dict[str, Any]]]) -> None:
        self.generate = generate
        self.secret = secrets.token_bytes(SECRET_BYTES)
        self.replica = secrets.token_hex(8)
        self._server: asyncio.AbstractServer | None = None
        self._address: tuple[str, int] | None = None
        self._starting = asyncio.Lock()

    async def address(self, host: str) -> dict[str, Any]:
        """Start listening on ``host`` (once) and say where: replica id, host, port and secret."""
        async with self._starting:
            if self._server is None:
                self._server = await asyncio.start_server(self._serve, host, 0)
                self._address = (host, self._server.sockets[0].getsockname()[1])
        return {"replica": self.replica, "host": self._address[0], "port": self._address[1],
                "secret": self.secret}

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tasks: dict[int, asyncio.Task] = {}
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                hello = await reader.readexactly(SECRET_BYTES)
            if not hmac.compare_digest(hello, self.secret):
                return
            while True:
                msg = await read_frame(reader)
                if msg[0] == "gen":
                    cid = msg[1]
                    tasks[cid] = asyncio.create_task(self._stream(cid, msg[2], writer, tasks))
                elif msg[0] == "cancel":
                    task = tasks.pop(msg[1], None)
                    if task is not None:
                        task.cancel()
                        # Let its cleanup (the engine's abort, the lane's count) run before the next
                        # message: a request sent after a cancel then finds the slot free.
                        await asyncio.wait([task], timeout=CANCEL_WAIT_S)
        except (LinkClosed, asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass  # the front door went away (or never said the secret): its streams end below
        finally:
            for task in tasks.values():
                task.cancel()  # frees every engine sequence this connection had
            writer.close()

    async def _stream(self, cid: int, request: Any, writer: asyncio.StreamWriter,
                      tasks: dict[int, asyncio.Task]) -> None:
        events = self.generate(request)
        try:
            try:
                async for event in events:
                    writer.write(frame(("ev", cid, event)))
                    # The front door's reader never stops (it queues per stream); drain only bounds
                    # this replica's buffer while that process stalls.
                    await writer.drain()
                end = ("end", cid)
            except Exception as e:  # noqa: BLE001 - the stream's typed end, raised at the front door
                end = ("exc", cid, _picklable(e))
            writer.write(frame(end))
        except (ConnectionError, RuntimeError):
            pass  # the connection is gone; _serve cancels the rest
        finally:
            tasks.pop(cid, None)
            await events.aclose()


class LinkStream:
    """One request's events from a lane replica: the interface of a Serve streaming response
    (``__anext__`` raises the lane's exception; ``cancel()`` frees the sequence)."""

    def __init__(self, conn: _Conn, cid: int) -> None:
        self._conn, self._cid = conn, cid
        self._queue: asyncio.Queue = asyncio.Queue()
        self._ended = False

    def __aiter__(self) -> LinkStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._ended:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, dict):
            return item
        self._ended = True
        self._conn.streams.pop(self._cid, None)
        if item is None:
            raise StopAsyncIteration
        raise item

    def cancel(self) -> None:
        if not self._ended:
            self._ended = True
            self._conn.cancel(self._cid)


class _Conn:
    """One connection to one lane replica, shared by every request of a front door."""

    def __init__(self, replica: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.replica, self.writer = replica, writer
        self.streams: dict[int, LinkStream] = {}
        self.alive = True
        self._next = 0
        self._reader = asyncio.create_task(self._read(reader))

    @classmethod
    async def open(cls, where: dict[str, Any]) -> _Conn:
        reader, writer = await asyncio.open_connection(where["host"], where["port"])
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.write(where["secret"])
        return cls(where["replica"], reader, writer)

    def start(self, request: Any) -> LinkStream:
        self._next += 1
        stream = self.streams[self._next] = LinkStream(self, self._next)
        self.writer.write(frame(("gen", self._next, request)))
        return stream

    def cancel(self, cid: int) -> None:
        if self.streams.pop(cid, None) is not None and self.alive:
            with contextlib.suppress(Exception):
                self.writer.write(frame(("cancel", cid)))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        error: BaseException = LaneUnavailable("the link to the lane replica closed")
        try:
            while True:
                msg = await read_frame(reader)
                stream = self.streams.get(msg[1])
                if stream is None:
                    continue  # cancelled here already
                kind = msg[0]
                stream._queue.put_nowait(msg[2] if kind in ("ev", "exc") else None)
        except LinkClosed as e:
            error = LaneUnavailable(f"the link to the lane replica closed ({e})")
        except BaseException as e:  # noqa: BLE001 - ends every open stream below
            error = LaneUnavailable(f"the link to the lane replica failed ({type(e).__name__}: {e})")
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self.alive = False
            for stream in list(self.streams.values()):
                stream._queue.put_nowait(error)
            self.streams.clear()
            self.writer.close()

    def close(self) -> None:
        self._reader.cancel()


class LaneLinks:
    """A front door's links to the replicas of one lane.

    Args:
        handle: the lane's Serve handle (for ``link_address``, Serve-routed to some replica).
        replicas: how many replicas the lane has (discovery asks until it has seen this many).
        head: builds a front door's own link to a replica's ring head from ``(replica, its
            link_address()["head"])`` (the fast lane: ``serve.lanes.head_links.HeadConn.open``);
            a request to a replica goes there while it is up, else over the replica's link.
            ``None``: replicas' links only.
    """

    def __init__(self, handle: Any, replicas: int,
                 head: Callable[[str, dict[str, Any]], Awaitable[Any]] | None = None) -> None:
        self.handle, self.replicas, self.head = handle, replicas, head
        self.conns: dict[str, _Conn] = {}
        self.heads: dict[str, Any] = {}
        """Replica id -> this front door's link to its ring's head (``HeadConn``)."""
        self._discovered_at = -float("inf")
        self._discovering: asyncio.Lock | None = None

    def _complete(self, live: dict[str, _Conn]) -> bool:
        """Every replica has a live link (and, with ``head``, a live head link)."""
        if len(live) < self.replicas:
            return False
        return self.head is None or all(r in self.heads and self.heads[r].alive for r in live)

    async def _discover(self) -> None:
        self._discovering = self._discovering or asyncio.Lock()
        async with self._discovering:
            live = {r: c for r, c in self.conns.items() if c.alive}
            if self._complete(live) or time.monotonic() - self._discovered_at < REDISCOVER_S:
                self.conns = live
                return
            self._discovered_at = time.monotonic()
            # Serve routes each call to some replica: ask a few times to meet them all.
            try:
                answers = await asyncio.gather(
                    *(self.handle.link_address.remote() for _ in range(2 * self.replicas)), return_exceptions=True)
            except Exception as e:  # noqa: BLE001 - a lane without links: the router uses its handle
                log.warning("lane link discovery failed: %s", e)
                answers = []
            for where in answers:
                if isinstance(where, BaseException):
                    log.warning("lane link discovery failed: %s", where)
                    continue
                if not isinstance(where, dict):
                    continue
                replica = where["replica"]
                if replica not in live:
                    try:
                        live[replica] = await _Conn.open(where)
                    except OSError as e:
                        log.warning("cannot open a link to lane replica %s: %s", replica, e)
                        continue
                old = self.heads.get(replica)
                if self.head is not None and where.get("head") and (old is None or not old.alive):
                    try:
                        self.heads[replica] = await self.head(replica, where["head"])
                    except Exception as e:  # noqa: BLE001 - requests go over the replica's link instead
                        log.warning("cannot open a link to the ring head of lane replica %s: %s", replica, e)
                    else:
                        if old is not None:
                            old.close()
            for replica in [r for r in self.heads if r not in live]:
                self.heads.pop(replica).close()
            self.conns = live

    async def connect(self) -> None:
        """Open links to the lane's replicas now (``open`` does when it finds none)."""
        self._discovered_at = -float("inf")
        await self._discover()

    async def open(self, request: Any, tried: set[str], prefer: str | None = None) -> tuple[str, LinkStream] | None:
        """Start ``request`` on replica ``prefer`` if it is up and not in ``tried`` (session affinity:
        it holds the conversation's prefix), else on the least-busy replica not in ``tried``, from
        its ring's head when this front door has a live link to it, else over the replica's link;
        ``None`` if no link is up (the router then uses the Serve handle)."""
        if not self._complete({r: c for r, c in self.conns.items() if c.alive}):
            await self._discover()
        choices = [c for c in self.conns.values() if c.alive and c.replica not in tried]
        if not choices:
            return None

        def busy(c: _Conn) -> int:
            head = self.heads.get(c.replica)
            return len(c.streams) + (len(head.streams) if head is not None else 0)

        preferred = [c for c in choices if c.replica == prefer]
        conn = preferred[0] if preferred else min(choices, key=busy)
        head = self.heads.get(conn.replica)
        if head is not None and head.alive:
            return conn.replica, head.start(request)
        return conn.replica, conn.start(request)

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        for head in self.heads.values():
            head.close()
