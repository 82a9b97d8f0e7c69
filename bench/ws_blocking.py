"""A blocking WebSocket client for timing first tokens: ``websockets``' sans-I/O ``ClientProtocol``
over a plain socket, no event loop and no thread.

Why: ``make bench`` holds a warm WebSocket's first token against one round trip plus the engine's own
first token in process, and that engine figure is taken by a blocking client (the ring's link:
send, then ``recv`` in the kernel). Timed with ``websockets``' asyncio client on the standard event
loop, the served side also pays its client's event loop (on a 2-core VM, 0.12 ms more per first
token than this client on the same door in the same rounds, 0.07 ms more on uvloop). The same kind
of client on both sides
leaves the serving path's own cost in the ratio; ``fastmode bench gateway`` reports the asyncio
client's figures beside it.
"""

from __future__ import annotations

import socket

from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.uri import parse_uri


class BlockingWebSocket:
    """One client connection: ``send(text)``, ``recv() -> str`` (the next text message), ``close()``.

    Args:
        url: ``ws://host:port/path`` (``wss`` is not served here).
        headers: extra headers of the upgrade request (``Authorization``).
        timeout_s: the socket's timeout for connecting and for each read.
    """

    def __init__(self, url: str, headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> None:
        uri = parse_uri(url)
        if uri.secure:
            raise ValueError(f"{url}: wss is not served by this client")
        self.sock = socket.create_connection((uri.host, uri.port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.proto = ClientProtocol(uri, max_size=None)
        request = self.proto.connect()
        for k, v in (headers or {}).items():
            request.headers[k] = v
        self.proto.send_request(request)
        self._flush()
        self._messages: list[str] = []
        while self.proto.state is State.CONNECTING:
            self._read()
        if self.proto.handshake_exc is not None:
            raise self.proto.handshake_exc

    def _flush(self) -> None:
        for chunk in self.proto.data_to_send():
            if chunk:
                self.sock.sendall(chunk)

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            self.proto.receive_eof()
            raise ConnectionError("the server closed the connection")
        self.proto.receive_data(data)
        for event in self.proto.events_received():
            if getattr(event, "opcode", None) is Opcode.TEXT:
                self._messages.append(event.data.decode())
        self._flush()  # pongs, and the close handshake's answer
        if self.proto.state is State.CLOSED or (self.proto.close_rcvd is not None and not self._messages):
            raise ConnectionError(f"the server closed the connection ({self.proto.close_rcvd})")

    def send(self, text: str) -> None:
        self.proto.send_text(text.encode())
        self._flush()

    def recv(self) -> str:
        while not self._messages:
            self._read()
        return self._messages.pop(0)

    def close(self) -> None:
        try:
            if self.proto.state is State.OPEN:
                self.proto.send_close(1000)
                self._flush()
        except OSError:
            pass
        finally:
            self.sock.close()

    def __enter__(self) -> BlockingWebSocket:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
