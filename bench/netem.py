"""An emulated network between the benchmark's client and the gateway, set up by the benchmark.

As root: a network namespace joined to this one by a veth pair. The client runs inside the
namespace (``ip netns exec``) and reaches the gateway through the veth and a relay on the host end,
so every packet crosses a real second network stack. The delay is ``tc netem`` on both veth ends
(half the round trip each way) where the kernel has ``sch_netem``; where it does not (this
development machine's kernel: "Specified qdisc kind is unknown"), the relay itself holds every
chunk for half the round trip in each direction and adds one round trip to each new connection (the
TCP handshake netem would have delayed), and the result says which was used. Not root: skipped
with a message.

``DelayRelay`` is the relay: a TCP forwarder whose per-direction FIFO delays each chunk from its
arrival, so back-to-back chunks are not delayed twice (propagation delay, not a bandwidth limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Iterator


class DelayRelay:
    """Forward ``listen_host:port`` -> ``target`` with ``one_way_s`` added each way, and
    ``handshake_s`` before a new connection's first byte reaches the target."""

    def __init__(self, listen_host: str, target: tuple[str, int], one_way_s: float = 0.0,
                 handshake_s: float = 0.0) -> None:
        self.listen_host, self.target = listen_host, target
        self.one_way_s, self.handshake_s = one_way_s, handshake_s
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delay-relay", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def __enter__(self) -> DelayRelay:
        self._thread.start()
        if not self._ready.wait(10) or not self.port:
            raise RuntimeError(f"relay could not listen on {self.listen_host}")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, self.listen_host, 0))
            self.port = self._server.sockets[0].getsockname()[1]
        finally:
            self._ready.set()
        self._loop.run_forever()
        self._server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        hold_until = time.monotonic() + self.handshake_s
        await asyncio.gather(self._pipe(reader, up_writer, hold_until), self._pipe(up_reader, writer, 0.0),
                             return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold_until: float) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                delay = max(due, hold_until) - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
            with contextlib.suppress(OSError):
                writer.write_eof()

        sender = asyncio.ensure_future(send())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((time.monotonic() + self.one_way_s, data))
        except OSError:
            pass
        queue.put_nowait((time.monotonic() + self.one_way_s, b""))
        with contextlib.suppress(Exception):
            await sender
        writer.close()


@dataclass
class Network:
    """Where the client runs (``client_prefix`` before its command), the host to connect to, how the
    delay is made (``method``) and the round trip asked for."""

    client_prefix: list[str]
    host: str
    port: int
    method: str
    rtt_ms: float


def can_emulate() -> str | None:
    """``None`` if this process can build the namespace, else why not (the skip message)."""
    if os.geteuid() != 0:
        return "the emulated network needs root (network namespaces); skipped"
    if not shutil.which("ip"):
        return "the emulated network needs iproute2's `ip`; skipped"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _netem(dev: str, one_way_ms: float, netns: str | None = None) -> str | None:
    """Add netem delay on ``dev``; ``None`` on success, else tc's error."""
    cmd = ["tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", f"{one_way_ms:g}ms"]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    if not shutil.which("tc"):
        return "tc not installed"
    r = subprocess.run(cmd, capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"tc exited {r.returncode}")


@contextlib.contextmanager
def emulated_network(target_port: int, rtt_ms: float, *, target_host: str = "127.0.0.1",
                     subnet: str = "10.213.0") -> Iterator[Network]:
    """A namespace + veth path to ``target_host:target_port`` with ``rtt_ms`` round trip (see the
    module docstring). Raises ``PermissionError`` with the skip message when it cannot."""
    reason = can_emulate()
    if reason:
        raise PermissionError(reason)
    tag = f"{os.getpid() % 100000}"
    ns, host_dev, ns_dev = f"fmbench{tag}", f"fmb{tag}h", f"fmb{tag}n"
    host_ip, ns_ip = f"{subnet}.1", f"{subnet}.2"
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", host_dev, "type", "veth", "peer", "name", ns_dev)
        _ip("link", "set", ns_dev, "netns", ns)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_dev)
        _ip("link", "set", host_dev, "up")
        for args in (("addr", "add", f"{ns_ip}/30", "dev", ns_dev), ("link", "set", ns_dev, "up"),
                     ("link", "set", "lo", "up")):
            _ip("netns", "exec", ns, "ip", *args)
        one_way = rtt_ms / 2
        err = _netem(host_dev, one_way) if rtt_ms > 0 else None
        if err is None and rtt_ms > 0:
            err = _netem(ns_dev, one_way, ns)
            if err is not None:  # one end delayed, the other not: undo, the relay delays both ways
                subprocess.run(["tc", "qdisc", "del", "dev", host_dev, "root"], capture_output=True)
        if err is None:
            relay = DelayRelay(host_ip, (target_host, target_port))
            method = "veth + tc netem" if rtt_ms > 0 else "veth, no delay"
        else:
            relay = DelayRelay(host_ip, (target_host, target_port), one_way / 1e3, rtt_ms / 1e3)
            method = f"veth + userspace delay relay (tc netem unavailable: {err})"
        with relay:
            yield Network(["ip", "netns", "exec", ns], host_ip, relay.port, method, rtt_ms)
    finally:
        _ip("link", "del", host_dev, check=False)
        _ip("netns", "del", ns, check=False)
