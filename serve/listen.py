"""``listen``: serve an ASGI app on a TCP port from inside a Serve replica (the gateway's own server).

Behind Ray Serve's HTTP proxy, every request and every streamed chunk of a response crosses two
processes (proxy -> replica, then replica -> proxy as a streamed item, each a fixed CPU cost).
With ``http.server: gateway`` the gateway replica listens itself, so a token's chunk
travels lane replica -> gateway -> client. The port is not shared (no ``SO_REUSEPORT``): a second
server on it fails at once instead of silently taking half of the connections.

Each request's head (request line and headers, a WebSocket upgrade's too) must arrive within
``header_timeout_s`` and ``max_header_bytes``: uvicorn itself starts no timer before a request's
head is complete, so without one a client that opens connections and trickles partial headers
(slowloris) would keep them, and their buffers, forever. Past the deadline the server answers
408 and closes; past the size, 431. Its body then has ``body_timeout_s`` from the head's end and
``max_body_bytes`` (a ``content-length`` over it is refused before any of the body is read): past
them, 408 or 413 and close, so neither a body trickled slowly nor a huge one holds the gateway's
memory. Other clients are served meanwhile regardless: the server is one event loop, and a partial
request costs it a socket and a buffer, not a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the replica's process owns its signals."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class _HeadLimits(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools) with a deadline and a size cap on each request's head,
    and then on its body.

    The head's deadline runs from the connection's start (or a keep-alive request's first byte) to the
    end of its headers; its size counts every byte received while the head is incomplete (a chunk that
    also completes it is not counted, so the cap may be passed by one read of the socket). The body's
    deadline runs from the end of the headers to the end of the body (a WebSocket upgrade has none);
    its size counts the body's bytes as they are parsed, after a ``content-length`` over the cap has
    been refused outright."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 65536
    body_timeout_s: float = 30.0
    max_body_bytes: int = 8 * 2**20

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._head_bytes, self._head_timer = 0, None
        self._body_bytes, self._body_timer = 0, None
        self._start_head_timer()

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        upgrade = self.parser.should_upgrade()
        declared = next((v for k, v in self.headers if k == b"content-length"), None)
        if not upgrade and declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            self._refuse(b"413 Content Too Large", before_app=True)  # the app never sees it; no body is read
            return
        super().on_headers_complete()
        if not upgrade:
            self._body_bytes = 0
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_timeout)

    def on_body(self, body: bytes) -> None:
        if self.transport.is_closing():
            return
        self._body_bytes += len(body)
        if self._body_bytes > self.max_body_bytes:
            self._refuse(b"413 Content Too Large")
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._stop_body_timer()
        if self.transport.is_closing():
            return
        super().on_message_complete()

    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timeout(self) -> None:
        self._body_timer = None
        if not self.transport.is_closing() and not (self.cycle is not None and self.cycle.response_complete):
            self._refuse(b"408 Request Timeout")

    def _start_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer, self._head_bytes = None, 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_timer is not None and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.max_header_bytes:
                self._refuse(b"431 Request Header Fields Too Large", before_app=True)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        self._stop_body_timer()
        super().connection_lost(exc)

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:  # a pipelined request waits its turn
            self._start_head_timer()
        elif not self.transport.is_closing():
            self._refuse(b"408 Request Timeout", before_app=True)

    def _refuse(self, status: bytes, *, before_app: bool = False) -> None:
        """Answer ``status`` and close (only close, if the request's app has begun its own response;
        ``before_app``: the request got no app, ``self.cycle`` is still the previous request's)."""
        self._stop_head_timer()
        self._stop_body_timer()
        if before_app or self.cycle is None or not self.cycle.response_started:
            self.transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        self.transport.close()


async def listen(app: Any, host: str, port: int, *, ws_max_size: int, keep_alive_s: float = 5.0,
                 header_timeout_s: float = 10.0, max_header_bytes: int = 65536,
                 body_timeout_s: float = 30.0, max_body_bytes: int = 8 * 2**20,
                 tls_certfile: str | None = None, tls_keyfile: str | None = None
                 ) -> tuple[uvicorn.Server, asyncio.Task]:
    """Start serving ``app`` on ``host:port``; return once it accepts connections. With a
    certificate and its key (PEM files), the port speaks TLS only (https, wss).

    ``header_timeout_s`` and ``max_header_bytes`` bound each request's head, ``body_timeout_s`` and
    ``max_body_bytes`` its body (see above).
    Raises ``OSError`` if the port cannot be bound (another server has it), ``ssl.SSLError`` if the
    certificate and key do not load.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"the gateway cannot listen on {host}:{port}: {e.strerror}") from e
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    # Frames the gateway refuses itself (max_frame_bytes, with an error event) must reach it first:
    # uvicorn's own limit is set above it. Compression is off: deltas are short JSON, and deflate
    # per message costs more CPU than it saves on a LAN.
    protocol = type("HeadLimits", (_HeadLimits,), {"header_timeout_s": header_timeout_s,
                                                   "max_header_bytes": max_header_bytes,
                                                   "body_timeout_s": body_timeout_s,
                                                   "max_body_bytes": max_body_bytes})
    server = _Server(uvicorn.Config(app, lifespan="off", access_log=False, log_config=None, http=protocol,
                                    ws="websockets", ws_max_size=ws_max_size, ws_per_message_deflate=False,
                                    timeout_keep_alive=keep_alive_s, ssl_certfile=tls_certfile,
                                    ssl_keyfile=tls_keyfile))
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
            raise OSError(f"the HTTP server on {host}:{port} stopped while starting")
        await asyncio.sleep(0.01)
    return server, task
