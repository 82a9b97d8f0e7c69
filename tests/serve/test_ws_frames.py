"""The fast lane door's WebSocket codec (``serve.lanes.ws_frames``), against websockets' own protocol
objects: what a websockets client writes (masked, fragmented, 7/16/64-bit lengths, control frames
between fragments, in any pieces) is read as websockets' ``ServerProtocol`` alone reads it, and what
``text_frame`` writes a websockets client reads back. No sockets: bytes go from one sans-I/O
object to the other."""

from __future__ import annotations

import json
import random

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.streams import StreamReader
from websockets.uri import parse_uri

from serve.errors import InvalidRequest, parse_json
from serve.lanes.ws_frames import FrameReader, decode_json, encode_json, server_protocol, text_frame

VERSION = "test.v1"
MAX = 1 << 20


class Recorder:
    """A ``FrameHandler`` that accepts the upgrade and keeps what it is handed."""

    def __init__(self, proto: ServerProtocol) -> None:
        self.proto, self.got = proto, []

    def on_upgrade(self, request) -> None:
        self.proto.send_response(self.proto.accept(request))
        self.got.append(("upgrade", request.path))

    def on_text(self, data: bytes) -> list:
        self.got.append(("text", bytes(data)))
        return [len(data)]

    def on_binary(self) -> None:
        self.got.append(("binary",))


def handshake(subprotocols=(VERSION,)) -> tuple[ClientProtocol, bytes]:
    """A websockets client, open (answered by another server than the one under test, so that it
    can write its frames first), and its upgrade request's bytes."""
    client = ClientProtocol(parse_uri("ws://door.test/v1/responses"), subprotocols=list(subprotocols) or None,
                            max_size=None)
    client.send_request(client.connect())
    upgrade = b"".join(client.data_to_send())
    other = server_protocol(VERSION, MAX)
    other.receive_data(upgrade)
    other.send_response(other.accept(other.events_received()[0]))
    client.receive_data(b"".join(other.data_to_send()))
    assert client.state is State.OPEN and client.events_received()[0].status_code == 101
    return client, upgrade


def reference(data: bytes) -> list[tuple]:
    """What websockets' ``ServerProtocol`` alone makes of ``data``: the same messages, fragments
    joined, as ``Recorder`` would keep them."""
    proto = ServerProtocol(max_size=MAX)
    proto.receive_data(data)
    got, parts = [], None
    for event in proto.events_received():
        if not isinstance(event, Frame):
            proto.send_response(proto.accept(event))
            got.append(("upgrade", event.path))
        elif event.opcode is Opcode.TEXT or (event.opcode is Opcode.CONT and parts is not None):
            parts = (parts or []) + [event.data]
            if event.fin:
                got.append(("text", b"".join(parts)))
                parts = None
        elif event.opcode is Opcode.BINARY:
            got.append(("binary",))
    return got


def client_frames(client: ClientProtocol) -> bytes:
    """A conversation's frames as a websockets client writes them (masked, random masks)."""
    long16, long64 = b'"' + b"x" * 300 + b'"', b'"' + "é".encode() * 40_000 + b'"'
    client.send_text(b'{"type": "a"}')
    client.send_ping(b"p")
    client.send_text(b"")
    client.send_text(b"y" * 125)  # the longest 7-bit length
    client.send_text(b"z" * 126)  # the shortest 16-bit one
    client.send_text(long16)
    client.send_text(long64)  # over 65535: a 64-bit length
    client.send_text(b'{"frag', fin=False)
    client.send_ping(b"between fragments")
    client.send_continuation(b'mented": ', fin=False)
    client.send_continuation(b"true}", fin=True)
    client.send_binary(b"\x00\x01")
    client.send_text("ünïcödé".encode())
    return b"".join(client.data_to_send())


def read_in_pieces(data: bytes, cuts: list[int]) -> tuple[Recorder, FrameReader, list]:
    proto = server_protocol(VERSION, MAX)
    reader, rec, answers = FrameReader(proto), Recorder(proto), []
    at = 0
    for cut in [*cuts, len(data)]:
        if cut > at:
            answers += reader.feed(data[at:cut], rec)
            at = cut
    return rec, reader, answers


def test_a_websockets_clients_frames_are_read_as_websockets_reads_them_in_any_pieces():
    client, upgrade = handshake()
    frames = client_frames(client)
    want = reference(upgrade + frames)
    assert [m[0] for m in want].count("text") == 8 and ("binary",) in want
    rng = random.Random(0)
    splits = {"whole": [],
              "byte by byte (the first 300 bytes)": list(range(len(upgrade), len(upgrade) + 300)),
              **{f"random {i}": sorted(rng.sample(range(len(upgrade) + 1, len(upgrade) + len(frames)), 40))
                 for i in range(5)}}
    for name, cuts in splits.items():
        rec, reader, answers = read_in_pieces(upgrade + frames, [len(upgrade), *cuts])
        assert rec.got == want, name
        assert answers == [len(m[1]) for m in want if m[0] == "text"], name
        assert reader.whole and not reader.buf, name  # every text frame was read here, none left over


def test_frames_that_came_with_the_upgrade_request_are_read_by_the_protocol_object():
    """Whole frames in the upgrade's read are the protocol object's; a frame cut there leaves it
    mid-frame, so it reads on for good (``whole`` off)."""
    client, upgrade = handshake()
    frames = client_frames(client)
    want = reference(upgrade + frames)
    rec, reader, _ = read_in_pieces(upgrade + frames, [])
    assert rec.got == want and reader.whole
    rec, reader, _ = read_in_pieces(upgrade + frames, [len(upgrade) + 5, len(upgrade) + 20])
    assert rec.got == want and not reader.whole


def test_the_protocol_object_still_answers_pings_and_the_subprotocol_is_selected():
    for offered, selected in [((VERSION,), VERSION), (("other", VERSION), VERSION), ((), None)]:
        client, upgrade = handshake(offered)
        proto = server_protocol(VERSION, MAX)
        reader, rec = FrameReader(proto), Recorder(proto)
        reader.feed(upgrade, rec)
        assert b"".join(proto.data_to_send()).startswith(b"HTTP/1.1 101")
        assert proto.subprotocol == selected == client.subprotocol
        client.send_ping(b"are you there")
        reader.feed(b"".join(client.data_to_send()), rec)
        client.receive_data(b"".join(proto.data_to_send()))
        assert [(e.opcode, e.data) for e in client.events_received()] == [(Opcode.PONG, b"are you there")]


def opened() -> tuple[ClientProtocol, ServerProtocol, FrameReader, Recorder]:
    client, upgrade = handshake()
    proto = server_protocol(VERSION, 4096)
    reader, rec = FrameReader(proto), Recorder(proto)
    reader.feed(upgrade, rec)
    assert b"".join(proto.data_to_send()).startswith(b"HTTP/1.1 101")
    return client, proto, reader, rec


def close_code(client: ClientProtocol, proto: ServerProtocol) -> int:
    client.receive_data(b"".join(proto.data_to_send()))
    return client.close_rcvd.code


@pytest.mark.parametrize("length_form", [126, 127])
def test_a_frame_announced_over_max_size_fails_with_1009_on_its_header_alone(length_form):
    client, proto, reader, rec = opened()
    wide = (5000).to_bytes(2 if length_form == 126 else 8, "big")
    reader.feed(bytes((0x81, 0x80 | length_form)) + wide + b"\x00" * 4 + b"{", rec)
    assert proto.state is State.CLOSING and close_code(client, proto) == 1009
    assert rec.got == [("upgrade", "/v1/responses")] and not reader.whole


def test_an_unmasked_frame_fails_with_1002_and_what_follows_a_close_is_dropped_unread():
    client, proto, reader, rec = opened()
    unmasked = Frame(Opcode.TEXT, b'{"a": 1}').serialize(mask=False, extensions=[])
    reader.feed(unmasked + Frame(Opcode.TEXT, b"later").serialize(mask=True, extensions=[]), rec)
    assert close_code(client, proto) == 1002 and rec.got == [("upgrade", "/v1/responses")]

    client, proto, reader, rec = opened()
    client.send_text(b"first")
    client.send_close(1000)
    data = b"".join(client.data_to_send()) + Frame(Opcode.TEXT, b"after the close").serialize(mask=True,
                                                                                              extensions=[])
    reader.feed(data, rec)
    assert rec.got[1:] == [("text", b"first")] and not reader.buf
    assert proto.state is not State.OPEN


def test_a_whole_text_frame_inside_a_fragmented_message_or_with_a_reserved_bit_fails_with_1002():
    """Frames a websockets client never writes, hand-serialized: the protocol object refuses them."""
    inside = b"".join(f.serialize(mask=True, extensions=[])
                      for f in [Frame(Opcode.TEXT, b'{"a', fin=False), Frame(Opcode.TEXT, b'"}')])
    whole = Frame(Opcode.TEXT, b'{"a": 1}').serialize(mask=True, extensions=[])
    for data in [inside, bytes((whole[0] | 0x40,)) + whole[1:]]:  # RSV1, no extension negotiated
        client, proto, reader, rec = opened()
        reader.feed(data, rec)
        assert close_code(client, proto) == 1002 and rec.got == [("upgrade", "/v1/responses")]


@pytest.mark.parametrize("n", [0, 1, 125, 126, 127, 65535, 65536, 70_000])
def test_text_frame_is_read_by_websockets_as_the_frame_send_text_writes(n):
    payload = bytes(random.Random(n).choices(b"abc{}\"", k=n))
    server = server_protocol(VERSION, MAX)
    server.state = State.OPEN
    server.send_text(payload)
    assert text_frame(payload) == b"".join(server.data_to_send())  # byte for byte

    client, proto, reader, rec = opened()
    client.receive_data(text_frame(payload))
    events = client.events_received()
    assert [(e.opcode, e.fin, e.data) for e in events] == [(Opcode.TEXT, True, payload)]

    stream = StreamReader()  # websockets' frame parser, by itself
    parser = Frame.parse(stream.read_exact, mask=False)
    stream.feed_data(text_frame(payload))
    with pytest.raises(StopIteration) as done:
        next(parser)
    assert done.value.value == Frame(Opcode.TEXT, payload, fin=True)


def test_the_json_reads_as_pythons_json():
    """``decode_json`` (msgspec, then Python's ``json`` for what msgspec refuses) gives what
    ``json.loads`` gives, and the gateway's error where ``json.loads`` fails; ``encode_json`` writes
    what ``json.loads`` reads back equal, lone surrogates included."""
    good = [b'{"a": [1, 2.5, -0.0, 1e-7, true, null, "\\u00e9\\n"]}', '{"\u00e9": "\u20ac"}'.encode(),
            b'{"n": NaN, "i": Infinity}', b'{"big": 123456789012345678901234567890}', b'{"a": 1, "a": 2}',
            b'{"x": 1e400}', '{"u": 1}'.encode("utf-16"), b'  {"ws" : 1 }\n', b'"\\ud800"']
    for data in good:
        got, ref = decode_json(data), json.loads(data)
        assert json.dumps(got) == json.dumps(ref), data
    for data in [b"not json", b'{"a": 1} x', b"[" * 100_000, b"\xff\xfe{", b'{"a": }']:
        with pytest.raises(InvalidRequest) as e:
            decode_json(data)
        with pytest.raises(InvalidRequest) as ref:
            parse_json(data, "the frame")
        assert e.value.message == ref.value.message
    for event in [{"type": "x", "id": "\ud800", "delta": "caf\u00e9 \u20ac", "n": 1.5, "none": None},
                  {"type": "x", "nested": {"a": [1, 2]}}]:
        assert json.loads(encode_json(event)) == event
