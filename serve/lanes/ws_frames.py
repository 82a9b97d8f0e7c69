"""A WebSocket server's codec for a select loop (RFC 6455): what the fast lane's door reads and writes.

websockets' sans-I/O ``ServerProtocol`` does the upgrade, pings, closes, fragments and every
failure; the frames a first token waits on are read and written here by hand, because the
protocol object's parser is a generator that steps once per header field and its writer builds a
``Frame`` per event:

- ``server_protocol``, ``offered_subprotocols``: the upgrade's protocol object and the client's offer.
- ``FrameReader``: a connection's incoming bytes as the handler's upgrade, text messages and
  binary frames; a whole, unfragmented, masked text frame is unmasked here, all else goes to the
  protocol object.
- ``text_frame``: a server's unfragmented text frame.
- ``decode_json``, ``encode_json``: a frame's JSON, read and written by msgspec (C), with the
  gateway's errors and Python's ``json`` for what msgspec refuses.

Nothing here knows responses or requests: the door (``serve.lanes.door``) is the handler.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Protocol

import msgspec
from websockets.frames import Opcode, apply_mask  # the C one where built (websockets.speedups)
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from ..errors import parse_json


def server_protocol(subprotocol: str, max_size: int) -> ServerProtocol:
    """websockets' protocol object for one server connection: ``subprotocol`` is selected when
    the client offers it (a browser offers it beside its key), and a client that offers none is
    served too; a message over ``max_size`` bytes fails the connection (1009)."""
    def select(_, offered: list[str]) -> str | None:
        return subprotocol if subprotocol in offered else None

    return ServerProtocol(select_subprotocol=select, max_size=max_size)


def offered_subprotocols(request: Request) -> list[str]:
    """The subprotocols an upgrade request offers, in order (``Sec-WebSocket-Protocol``, any number
    of headers, comma-separated)."""
    return [p.strip() for v in request.headers.get_all("Sec-WebSocket-Protocol") for p in v.split(",")]


class FrameHandler(Protocol):
    """What a ``FrameReader`` hands a connection's messages to."""

    def on_upgrade(self, request: Request) -> None:
        """The upgrade request: answer it (``proto.accept``/``reject``, ``send_response``)."""

    def on_text(self, data: bytes) -> list:
        """A whole text message's UTF-8 payload (unvalidated); answers what ``feed`` collects."""

    def on_binary(self) -> None:
        """A binary frame (its payload is not kept)."""


class FrameReader:
    """A server connection's incoming bytes, read frame by frame (RFC 6455, 5.2).

    While the connection is open, a whole, unfragmented, masked text frame (what a client's
    request is) is unmasked here and handed to ``on_text`` at once; every other frame (ping,
    close, binary, fragments, reserved bits) goes whole to the protocol object, which answers it
    as ever, and a frame announced over ``max_size`` or unmasked goes to it at once, to fail the
    connection (1009, 1002). The protocol object is only ever handed whole frames, so it always
    waits at a frame's start when a text frame comes. Whole frames that came in the upgrade
    request's read are the protocol object's; if that read ends inside a frame, the protocol object
    reads on for good (``whole`` off), as it does after a frame it fails. Once the connection is no
    longer open, what the client sends is dropped unread.
    """

    def __init__(self, proto: ServerProtocol) -> None:
        self.proto = proto
        self.max_size = 2**64 if proto.max_message_size is None else proto.max_message_size
        """The largest frame read here; a frame announced over it goes to the protocol object."""
        self.buf = bytearray()
        """Received bytes of an open connection's next frame, not yet whole."""
        self.whole = True
        """Whether the protocol object is only ever handed whole frames; off for good once the
        upgrade request's read ended inside a frame, or a frame fails it."""
        self._parts: list[bytes] | None = None
        """The fragments so far of a fragmented text message."""

    def feed(self, data: bytes, on: FrameHandler) -> list:
        """Read ``data``, handing what it completes to ``on`` in order; answers the ``on_text``
        answers, concatenated."""
        proto = self.proto
        if not self.whole or proto.state is not State.OPEN:
            proto.receive_data(data)
            got = self._events(on)
            if proto.reader.buffer:  # mid-frame after the upgrade request's read: the protocol reads on
                self.whole = False
            return got
        buf = self.buf
        buf += data
        got: list = []
        at, n, limit = 0, len(buf), self.max_size
        while n - at >= 2 and proto.state is State.OPEN:
            b0, b1 = buf[at], buf[at + 1]
            size, head = b1 & 0x7F, at + 2
            if size >= 126:
                wide = 2 if size == 126 else 8
                if n - head < wide:
                    break
                size, head = int.from_bytes(buf[head:head + wide], "big"), head + wide
            if size > limit or not b1 & 0x80:
                self.whole = False  # the protocol fails the connection; it reads what is left
                proto.receive_data(bytes(buf[at:]))
                got += self._events(on)
                at = n
                break
            end = head + 4 + size
            if end > n:
                break
            if b0 == 0x81 and proto.current_size is None:  # FIN, text, no reserved bits, not mid-message
                got += on.on_text(apply_mask(buf[head + 4:end], buf[head:head + 4]))
            else:
                proto.receive_data(bytes(buf[at:end]))
                got += self._events(on)
            at = end
        if proto.state is State.OPEN:
            del buf[:at]
        else:
            buf.clear()  # closing or closed: what the client sends now is dropped unread
        return got

    def _events(self, on: FrameHandler) -> list:
        """The protocol object's events since the last call, handed to ``on``."""
        got: list = []
        proto = self.proto
        for event in proto.events_received():
            if isinstance(event, Request):
                on.on_upgrade(event)
            elif proto.state is not State.OPEN:
                continue  # closing: what the client still sends is dropped unread
            elif event.opcode is Opcode.TEXT and event.fin:
                got += on.on_text(event.data)
            elif event.opcode is Opcode.TEXT or (event.opcode is Opcode.CONT and self._parts is not None):
                # a fragmented text message (RFC 6455, 5.4): handled once whole; the protocol object
                # keeps the order of the fragments and max_size for the whole message
                self._parts = (self._parts or []) + [event.data]
                if event.fin:
                    data, self._parts = b"".join(self._parts), None
                    got += on.on_text(data)
            elif event.opcode is Opcode.BINARY:
                on.on_binary()
        return got


def text_frame(payload: bytes) -> bytes:
    """A server's unfragmented text frame (RFC 6455, 5.2: FIN, opcode 1, unmasked; no extension is
    negotiated). Framed here, not by ``ServerProtocol.send_text``, which builds a ``Frame`` and
    serializes it through its extensions: on the way to a first token that is a sizeable share of
    what writing the events costs the head. The protocol object still writes its own frames (pongs,
    closes)."""
    n = len(payload)
    if n < 126:
        return bytes((0x81, n)) + payload
    if n < 65536:
        return struct.pack("!BBH", 0x81, 126, n) + payload
    return struct.pack("!BBQ", 0x81, 127, n) + payload


_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()


def decode_json(data: bytes) -> Any:
    """A client frame's JSON, read by msgspec (C; Python's ``json`` is several times slower in a
    process whose caches a step has just emptied). What msgspec refuses is read again by
    ``serve.errors.parse_json``, so what is accepted and the errors given are the gateway's: NaN,
    UTF-16/32, integers past 64 bits are read as Python's ``json`` reads them, and a frame neither
    reads is ``InvalidRequest`` (``invalid_json``) with Python's message."""
    try:
        return _DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return parse_json(data, "the frame")


def encode_json(event: dict[str, Any]) -> bytes:
    """An event's compact UTF-8 JSON (msgspec, as ``decode_json``); Python's ``json`` (with
    ``\\u`` escapes) for the text msgspec will not write: a lone surrogate that a client's id
    carried in as an escape."""
    try:
        return _ENCODER.encode(event)
    except UnicodeEncodeError:
        return json.dumps(event, separators=(",", ":")).encode()


__all__ = ["FrameHandler", "FrameReader", "decode_json", "encode_json", "offered_subprotocols",
           "server_protocol", "text_frame"]
