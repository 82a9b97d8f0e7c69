"""``Link``: a one-way chip-to-chip channel for per-token hops, over a TCP socket.

A hop of the fast lane carries a few hundred bytes per token (one row of hidden states, or the
sampled token ids), so what matters is latency and what an idle chip costs, not bandwidth: a
round trip over these links is several times shorter than over a Ray compiled graph or actor
calls, and an idle link reader sleeps where a compiled-graph reader spins a core (``fastmode bench
sharding`` measures all three; ``docs/sharding.md``). The same code crosses nodes unchanged.

A message is a small picklable ``meta`` plus a list of tensors sent as raw bytes after it, in one
``sendmsg`` (no copy of the tensors on the way out):

    [u32 meta bytes][u32 data bytes] pickle((meta, [(dtype, shape), ...])) raw tensor bytes ...

``recv`` answers tensors that alias a fresh buffer (no copy on the way in either).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import select
import socket
import struct
import time
from typing import Any

import torch

_HEADER = struct.Struct("<II")
_DTYPES = {str(dt).removeprefix("torch."): (dt, torch.empty(0, dtype=dt).element_size())
           for dt in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8)}


class LinkClosed(ConnectionError):
    """The other end of a ``Link`` went away (its process ended, or it closed the link)."""


def _tune(sock: socket.socket) -> socket.socket:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a hop is one small write
    return sock


def listen(host: str) -> socket.socket:
    """A listening TCP socket on ``host`` and a free port (``getsockname()[1]``)."""
    server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, 0))
    server.listen(64)
    return server


SPIN_S = 0.002
"""Default ``Link.spin_s``: how long a receiver polls before it sleeps in the kernel."""


def poll(socks: list, deadline: float) -> bool:
    """Whether any of ``socks`` has something to read before ``time.perf_counter()`` reaches
    ``deadline``: polls (``select`` with a zero timeout), yielding the core between polls, never
    sleeping (see ``Link``)."""
    while True:
        if select.select(socks, [], [], 0)[0]:
            return True
        if time.perf_counter() >= deadline:
            return False
        os.sched_yield()


class Link:
    """One end of a connected socket: ``send(meta, tensors)`` / ``recv() -> (meta, tensors)``.

    ``spin_s``: before blocking, ``recv`` polls the socket for up to this long. Waking a sleeping
    core costs far more than a hop (most on a VM whose idle vCPUs halt; least on bare metal), and
    during decoding the next message comes within one step (well under a millisecond on the fast
    model), so a chip that has just sent its work polls for it. With no request running, the
    window runs out and the chip sleeps: an idle ring uses no CPU. Polling yields the core between
    polls (``sched_yield``), so other processes that share the core still run: without it, a ring
    whose chips share their cores with other processes runs several times slower.
    """

    def __init__(self, sock: socket.socket, spin_s: float = SPIN_S) -> None:
        self.sock = _tune(sock)
        self.sock.setblocking(True)
        self.spin_s = spin_s

    @classmethod
    def connect(cls, host: str, port: int, hello: Any = None, timeout_s: float = 30.0) -> Link:
        """Connect to a ``listen`` socket and, if given, send ``hello`` so the listener knows who came."""
        sock = socket.create_connection((host, port), timeout=timeout_s)
        link = cls(sock)
        if hello is not None:
            link.send(hello)
        return link

    def send(self, meta: Any, tensors: list[torch.Tensor] = ()) -> int:
        """Send one message; answers the bytes of its tensors (what a ``Hop`` reports)."""
        arrays = [t if t.is_contiguous() and t.device.type == "cpu" else t.contiguous().cpu() for t in tensors]
        descs = [(str(a.dtype).removeprefix("torch."), tuple(a.shape)) for a in arrays]
        head = pickle.dumps((meta, descs), protocol=pickle.HIGHEST_PROTOCOL)
        views = [memoryview(a.view(torch.uint8).numpy()) if a.numel() else b"" for a in arrays]
        data = sum(a.numel() * a.element_size() for a in arrays)
        try:
            self.sock.sendmsg([_HEADER.pack(len(head), data), head, *views])
        except OSError as e:
            raise LinkClosed(f"link closed while sending: {e}") from e
        return data

    def poll(self, timeout_s: float) -> bool:
        """Whether a message has started to arrive within ``timeout_s`` (polling, never sleeping)."""
        return poll([self.sock], time.perf_counter() + timeout_s)

    def recv(self) -> tuple[Any, list[torch.Tensor]]:
        """Block until one whole message has arrived (polling for ``spin_s`` first); ``LinkClosed``
        if the peer is gone."""
        if self.spin_s > 0:
            self.poll(self.spin_s)
        n_head, n_data = _HEADER.unpack(self._read(_HEADER.size))
        meta, descs = pickle.loads(self._read(n_head))
        buf = self._read(n_data) if n_data else bytearray()
        tensors, at = [], 0
        for dtype, shape in descs:
            dt, size = _DTYPES[dtype]
            n = 1
            for d in shape:
                n *= d
            t = torch.frombuffer(buf, dtype=dt, count=n, offset=at) if n else torch.empty(0, dtype=dt)
            tensors.append(t.view(shape))
            at += n * size
        return meta, tensors

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:])
            except OSError as e:
                raise LinkClosed(f"link closed while receiving: {e}") from e
            if k == 0:
                raise LinkClosed("the peer closed the link")
            got += k
        return buf

    def fileno(self) -> int:
        return self.sock.fileno()

    def read_messages(self) -> list[Any]:
        """``[meta]`` of the next message (``recv``): what a reader of several kinds of client takes
        (``sharding.ring.Head``)."""
        return [self.recv()[0]]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def frame(meta: Any) -> bytes:
    """A tensor-less message as bytes (what ``Link.send(meta)`` writes), for asyncio writers."""
    head = pickle.dumps((meta, []), protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(head), 0) + head


async def read_frame(reader) -> Any:
    """Read one tensor-less message from an ``asyncio.StreamReader``; ``LinkClosed`` at its end."""
    try:
        n_head, n_data = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        meta, _ = pickle.loads(await reader.readexactly(n_head))
        if n_data:
            await reader.readexactly(n_data)
    except (asyncio.IncompleteReadError, ConnectionError) as e:
        raise LinkClosed(f"link closed: {e}") from e
    return meta


def accept(server: socket.socket, count: int, timeout_s: float = 60.0) -> dict[Any, Link]:
    """Accept ``count`` links on ``server``, keyed by the ``hello`` each sent first."""
    server.settimeout(timeout_s)
    links = {}
    try:
        for _ in range(count):
            sock, _ = server.accept()
            link = Link(sock)
            hello, _ = link.recv()
            links[hello] = link
    except TimeoutError as e:
        raise LinkClosed(f"only {len(links)} of {count} links arrived within {timeout_s} s") from e
    finally:
        server.settimeout(None)
    return links
