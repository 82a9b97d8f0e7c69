"""The fast lane's door (``serve.lanes.door``): the gateway's WebSocket protocol, served by the ring's
head chip in its own loop.

Most tests run a ring in this process (one chip, eager, the shipped fast model) whose head serves
a door with small limits, and talk to it as a client does; the text is checked against
transformers' greedy output. The last ones use the shared app (``fastmode up``): the gateway hands
out the door's URL, and the door answers with the gateway's own text.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
import ray
from tokenizers import Tokenizer
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode

from models import TEST_FAST
from serve.lanes.door import DoorSpec
from sharding.pipeline import ShardedModel
from tests.pause import chip_processes, paused
from tests.serve.test_protocol import validate
from tests.sharding.conftest import hf_greedy

KEY = "sk-door-test"
MODEL = "fastmode-fast"
LIMITS = {"max_in_flight": 2, "frames_per_s": 50.0, "frame_burst": 30, "max_connections_per_key": 3,
          "header_timeout_s": 1.0, "idle_timeout_s": 2.0, "max_frame_bytes": 4096}
PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def door():
    """``(model, url)``: a one-chip ring of the fast model whose head serves a door."""
    ray.init(address="local", resources={"chip": 3}, num_cpus=2, include_dashboard=False, log_to_driver=False)
    spec = DoorSpec(model_id=MODEL, model_path=str(TEST_FAST), price=2.0, host="127.0.0.1",
                    keys=frozenset({KEY}), limits=LIMITS)
    try:
        with ShardedModel.from_pretrained(TEST_FAST, num_slots=4, max_len=256, prefix_cache=True, door=spec) as m:
            host, port = m.door_address
            yield m, f"ws://{host}:{port}/v1/responses"
    finally:
        ray.shutdown()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def ws(url: str, key: str | None = KEY, **kw):
    return connect(url, additional_headers={"Authorization": f"Bearer {key}"} if key else {}, max_size=None, **kw)


def create(rid: str, **kw) -> str:
    return json.dumps({"type": "response.create", "id": rid, "model": MODEL, "input": PROMPT,
                       "max_output_tokens": 16, "temperature": 0, **kw})


async def until_end(conn, rid: str) -> list[dict]:
    """Every event of ``rid`` until it ends; each one checked against docs/protocol.schema.json."""
    events = []
    while True:
        e = json.loads(await conn.recv())
        validate(e)
        if e["id"] == rid:
            events.append(e)
            if e["type"] in ("response.completed", "response.cancelled", "error"):
                return events


def text(events: list[dict]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def running(m) -> int:
    return ray.get(m.head_worker.ring_load.remote())["running"]


def test_the_door_streams_transformers_greedy_text(door):
    m, url = door
    tok = Tokenizer.from_file(str(TEST_FAST / "tokenizer.json"))
    ids = tok.encode(PROMPT).ids
    want = tok.decode(hf_greedy(TEST_FAST, ids, 16))

    async def main():
        async with ws(url) as conn:
            await conn.send(create("a"))
            first = await until_end(conn, "a")
            await conn.send(create("b"))  # the same prompt again: its prefix is cached
            return first, await until_end(conn, "b")

    first, second = run(main())
    for events in (first, second):
        assert [e["type"] for e in events][0] == "response.created"
        assert events[-1]["type"] == "response.completed"
        assert text(events) == want
        assert [e["seq"] for e in events if e["type"] == "response.output_text.delta"] == list(
            range(sum(e["type"] == "response.output_text.delta" for e in events)))
    done = first[-1]
    assert done["usage"]["input_tokens"] == len(ids) and done["usage"]["output_tokens"] == 16
    assert done["finish_reason"] == "length" and done["lane"] == "fast" and done["model"] == MODEL
    assert done["cost_units"] == pytest.approx(2.0 * (len(ids) + 16) / 1000)
    assert first[0]["input_tokens"] == len(ids) and first[0]["protocol"] == "fastmode.responses.v1"


def test_a_stop_string_ends_the_text_before_it(door):
    m, url = door
    tok = Tokenizer.from_file(str(TEST_FAST / "tokenizer.json"))
    full = tok.decode(hf_greedy(TEST_FAST, tok.encode(PROMPT).ids, 16))
    stop = full.strip()[3:6]  # some text from inside the greedy output

    async def main():
        async with ws(url) as conn:
            await conn.send(create("s", stop=stop))
            return await until_end(conn, "s")

    events = run(main())
    assert text(events) == full[:full.index(stop)]
    assert events[-1]["finish_reason"] == "stop"
    out = hf_greedy(TEST_FAST, tok.encode(PROMPT).ids, 16)
    through = next(k for k in range(1, 17) if stop in tok.decode(out[:k]))
    assert events[-1]["usage"]["output_tokens"] == through  # tokens past the stop string's are not output
    deadline = time.monotonic() + 10
    while running(m) and time.monotonic() < deadline:  # the sequence was aborted at the head
        time.sleep(0.05)
    assert running(m) == 0


@pytest.mark.parametrize("frame,code", [
    ("not json", "invalid_json"),
    ("[1, 2]", "invalid_event"),
    (json.dumps({"type": "response.create", "model": MODEL, "input": "x"}), "invalid_request"),
    (create("m", model="fastmode-full"), "unknown_model"),
    (create("p", previous_response_id="resp-1"), "invalid_request"),
    (create("t", temperature=5), "invalid_request"),
    (create("l", input="word " * 300), "prompt_too_long"),
    ('{"type": "response.create", "id": "u", "model": "fastmode-fast", "input": "a \\ud800 b"}', "invalid_request"),
    (create("n", temperature=float("nan")), "invalid_request"),  # NaN: read as Python's json reads it
    ('{"type": "response.create", "id": "\\udc80", "model": "fastmode-fast", "input": "x"}', "invalid_request"),
    (json.dumps({"type": "response.cancel", "id": "nobody"}), "unknown_id"),
    (json.dumps({"type": "response.delete", "id": "x"}), "unknown_event"),
])
def test_bad_frames_get_the_gateways_typed_errors_and_the_connection_lives_on(door, frame, code):
    m, url = door

    async def main():
        async with ws(url) as conn:
            await conn.send(frame)
            err = json.loads(await conn.recv())
            await conn.send(create("after"))
            return err, await until_end(conn, "after")

    err, after = run(main())
    validate(err)
    assert err["type"] == "error" and err["code"] == code, err
    assert after[-1]["type"] == "response.completed"


@pytest.mark.parametrize("fields,field", [
    ({"logprobs": 2}, "logprobs"),
    ({"include": ["message.output_text.logprobs"], "top_logprobs": 2}, "include"),  # OpenAI Responses' form
    ({"include": ["message.output_text.logprobs"]}, "include"),
])
def test_logprobs_are_refused_at_the_door_naming_the_field_the_client_sent(door, fields, field):
    m, url = door

    async def main():
        async with ws(url) as conn:
            await conn.send(create("lp", **fields))
            return await until_end(conn, "lp")

    (err,) = run(main())
    assert (err["type"], err["code"]) == ("error", "unsupported_parameter") and err["message"].startswith(f"{field}:")
    assert "gateway" in err["message"]


async def all_ended(conn, rids: set[str]) -> dict[str, list[dict]]:
    """Every event of each of ``rids`` until all have ended."""
    events: dict[str, list[dict]] = {rid: [] for rid in rids}
    open_ = set(rids)
    while open_:
        e = json.loads(await conn.recv())
        validate(e)
        events[e["id"]].append(e)
        if e["type"] in ("response.completed", "response.cancelled", "error"):
            open_.discard(e["id"])
    return events


def masked(opcode: Opcode, payload: bytes, fin: bool = True) -> bytes:
    """A client's frame, as the client serializes it (masked)."""
    return Frame(opcode, payload, fin).serialize(mask=True, extensions=[])


def test_frames_together_split_fragmented_and_long_are_read_as_websockets_sends_them(door):
    """The door reads whole text frames itself and hands every other frame to websockets' protocol
    object: two requests and a ping in one write, a frame in pieces, a fragmented message (sent by
    websockets' own client), a frame with a 16-bit length, and a ping the client awaits."""
    m, url = door
    tok = Tokenizer.from_file(str(TEST_FAST / "tokenizer.json"))
    want = tok.decode(hf_greedy(TEST_FAST, tok.encode(PROMPT).ids, 16))
    long_prompt = "# " + "a long comment line " * 8 + "\n" + PROMPT  # over 125 bytes: a 16-bit length

    async def main():
        async with ws(url) as conn:
            conn.transport.write(masked(Opcode.TEXT, create("t1").encode()) + masked(Opcode.PING, b"p")
                                 + masked(Opcode.TEXT, create("t2").encode()))
            together = await all_ended(conn, {"t1", "t2"})
            frame = masked(Opcode.TEXT, create("s").encode())
            for piece in (frame[:1], frame[1:5], frame[5:40], frame[40:]):
                conn.transport.write(piece)
                await asyncio.sleep(0.02)
            split = await until_end(conn, "s")
            whole = create("f")
            await conn.send(iter([whole[:10], whole[10:50], whole[50:]]))  # TEXT, CONT, CONT (fin)
            fragmented = await until_end(conn, "f")
            await conn.send(create("l", input=long_prompt))
            long = await until_end(conn, "l")
            await asyncio.wait_for(await conn.ping(), 10)
            return together, split, fragmented, long

    together, split, fragmented, long = run(main())
    for events in [*together.values(), split, fragmented]:
        assert events[-1]["type"] == "response.completed", events
        assert text(events) == want
    assert long[-1]["type"] == "response.completed"
    assert long[-1]["usage"]["input_tokens"] == len(tok.encode(long_prompt).ids)


def test_an_unmasked_frame_closes_with_1002_and_a_frame_announced_too_large_with_1009_at_once(door):
    """Both closes come from websockets' protocol object, as before the door read frames itself; the
    frame announced over ``max_frame_bytes`` (a 64-bit length) is refused on its header alone."""
    m, url = door

    async def main():
        async with ws(url) as conn:
            conn.transport.write(Frame(Opcode.TEXT, create("u").encode()).serialize(mask=False, extensions=[]))
            unmasked = await closed_with(conn)
        async with ws(url) as conn:
            conn.transport.write(bytes((0x81, 0x80 | 127)) + (100_000).to_bytes(8, "big") + b"\x00" * 4 + b"{")
            announced = await closed_with(conn)
        return unmasked, announced

    unmasked, announced = run(main())
    assert unmasked[0] == 1002 and unmasked[2] == []
    assert announced[0] == 1009 and announced[2] == []


def test_a_binary_frame_a_duplicate_id_and_too_many_in_flight_are_refused(door):
    m, url = door

    async def main():
        async with ws(url) as conn:
            await conn.send(b"\x00\x01")
            binary = json.loads(await conn.recv())
            with paused(chip_processes()) as head:  # the head reads them all at once: "x" is still in flight
                await conn.send(create("x", max_output_tokens=200, ignore_eos=True))  # at the second "x",
                await conn.send(create("x"))  # and "x" and "y" at "z"
                await conn.send(create("y", max_output_tokens=200, ignore_eos=True))
                await conn.send(create("z"))  # a third one: max_in_flight is 2
                head.reached()
            dup = json.loads(await conn.recv())
            events = []
            while not any(e.get("id") == "z" for e in events):
                events.append(json.loads(await conn.recv()))
            for rid in ("x", "y"):
                await conn.send(json.dumps({"type": "response.cancel", "id": rid}))
            return binary, dup, [e for e in events if e["id"] == "z"][0]

    binary, dup, third = run(main())
    assert binary["code"] == "binary_frame"
    assert dup["code"] == "duplicate_id" and dup["id"] == "x"
    assert third["code"] == "too_many_in_flight"


def settled(m) -> int:
    """The head's ``aborted`` count once no request runs (earlier tests' cancels have landed)."""
    deadline = time.monotonic() + 10
    while running(m) and time.monotonic() < deadline:
        time.sleep(0.05)
    return ray.get(m.head_worker.ring_load.remote())["aborted"]


def test_cancel_and_disconnect_free_the_heads_sequences(door):
    m, url = door
    aborted = settled(m)

    async def main():
        async with ws(url) as conn:
            await conn.send(create("c", max_output_tokens=200, ignore_eos=True))
            while json.loads(await conn.recv())["type"] != "response.output_text.delta":
                pass
            with paused(chip_processes()) as head:  # the stream cannot end before the cancel reaches it
                await conn.send(json.dumps({"type": "response.cancel", "id": "c"}))
                head.reached()
            events = []
            while not events or events[-1]["type"] != "response.cancelled":
                events.append(json.loads(await conn.recv()))
            await conn.send(create("d", max_output_tokens=200, ignore_eos=True))
            while json.loads(await conn.recv())["type"] != "response.output_text.delta":
                pass
            with paused(chip_processes()) as head:  # ... nor before the connection is gone
                conn.transport.abort()  # with "d" in flight
                head.reached()

    run(main())
    deadline = time.monotonic() + 10
    while running(m) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(m) == 0
    assert ray.get(m.head_worker.ring_load.remote())["aborted"] == aborted + 2


async def closed_with(conn) -> tuple[int, str, list[dict]]:
    """The close code and reason the server sent, and the events before it."""
    events = []
    with pytest.raises(ConnectionClosed) as e:
        while True:
            events.append(json.loads(await conn.recv()))
    return e.value.rcvd.code, e.value.rcvd.reason, events


def test_the_door_needs_the_key_and_its_path_and_keys_hold_a_bounded_number_of_connections(door):
    m, url = door

    async def main():
        out = []
        for key in (None, "sk-wrong"):  # as on the gateway: accepted, then closed with 1008
            async with ws(url, key=key) as conn:
                out.append(await closed_with(conn))
        with pytest.raises(InvalidStatus) as e:
            async with ws(url.replace("/v1/responses", "/v1/other")):
                pass
        out.append(e.value.response.status_code)
        held = [await ws(url) for _ in range(LIMITS["max_connections_per_key"])]
        async with ws(url) as conn:
            out.append(await closed_with(conn))
        for conn in held:
            await conn.close()
        await asyncio.sleep(0.2)
        async with ws(url) as conn:  # closing one gives its place back
            await conn.send(create("ok"))
            out.append((await until_end(conn, "ok"))[-1]["type"])
        return out

    no_key, wrong_key, other_path, over, ok = run(main())
    assert no_key == wrong_key == (1008, "missing or wrong API key", [])
    assert other_path == 404
    code, reason, events = over
    assert code == 1008 and "too many connections" in reason and [e["code"] for e in events] == ["too_many_connections"]
    assert ok == "response.completed"


def test_the_browsers_key_subprotocol_is_accepted_and_the_version_selected(door):
    import base64

    m, url = door
    encoded = base64.urlsafe_b64encode(KEY.encode()).decode().rstrip("=")

    async def main():
        async with connect(url, subprotocols=["fastmode.responses.v1", f"fastmode.key.{encoded}"]) as conn:
            await conn.send(create("b"))
            return conn.subprotocol, (await until_end(conn, "b"))[-1]["type"]

    assert run(main()) == ("fastmode.responses.v1", "response.completed")


def test_frames_over_the_rate_get_rate_limited(door):
    m, url = door

    async def main():
        async with ws(url) as conn:
            for _ in range(LIMITS["frame_burst"] + 5):
                await conn.send(json.dumps({"type": "response.cancel", "id": "none"}))
            codes = [json.loads(await conn.recv())["code"] for _ in range(LIMITS["frame_burst"] + 5)]
            return codes

    codes = run(main())
    assert codes.count("unknown_id") >= LIMITS["frame_burst"] - 1
    assert "rate_limited" in codes


def test_a_client_that_sends_on_through_its_refusals_is_closed_and_the_ring_serves_on(door):
    m, url = door

    async def main():
        async with ws(url) as conn:
            for _ in range(3 * LIMITS["frame_burst"]):  # many of them read by the head at once
                await conn.send(json.dumps({"type": "response.cancel", "id": "none"}))
            code, reason, events = await closed_with(conn)
        async with ws(url) as conn:
            await conn.send(create("after"))
            return code, reason, events, (await until_end(conn, "after"))[-1]["type"]

    code, reason, events, after = run(main())
    assert code == 1008 and reason == "frame rate limit exceeded"
    assert events[-1]["code"] == "rate_limited" and after == "response.completed"
    assert ray.get(m.head_worker.alive.remote())[0]


def test_a_client_that_never_answers_the_close_is_dropped(door):
    """The door closes (1008, frames past the budget) and the client neither answers nor hangs up:
    the head drops the connection within header_timeout_s, and the key's place comes back."""
    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri

    m, url = door
    proto = ClientProtocol(parse_uri(url))
    request = proto.connect()
    request.headers["Authorization"] = f"Bearer {KEY}"
    proto.send_request(request)
    sock = socket.create_connection(m.door_address)
    sock.sendall(b"".join(proto.data_to_send()))
    proto.receive_data(sock.recv(65536))  # the upgrade's answer
    assert proto.events_received()[0].status_code == 101
    for _ in range(3 * LIMITS["frame_burst"]):
        proto.send_text(json.dumps({"type": "response.cancel", "id": "none"}).encode())
    sock.sendall(b"".join(proto.data_to_send()))
    sock.settimeout(LIMITS["header_timeout_s"] + 5)
    started, got = time.monotonic(), b""
    while chunk := sock.recv(65536):  # read everything, answer nothing, until the door hangs up
        got += chunk
    assert time.monotonic() - started < LIMITS["header_timeout_s"] + 5
    assert b"\x88" in got  # a close frame came before the door hung up
    sock.close()


def test_a_frame_too_large_closes_with_1009_and_an_idle_connection_with_1000(door):
    m, url = door

    async def main():
        async with ws(url) as conn:
            await conn.send(create("big", input="x" * 5000))
            with pytest.raises(ConnectionClosed) as big:
                await conn.recv()
        started = time.monotonic()
        async with ws(url) as conn:
            with pytest.raises(ConnectionClosed) as idle:
                await conn.recv()
        return big.value.rcvd.code, idle.value.rcvd.code, time.monotonic() - started

    big, idle, waited = run(main())
    assert big == 1009 and idle == 1000
    assert LIMITS["idle_timeout_s"] - 0.1 <= waited < LIMITS["idle_timeout_s"] + 5


def test_a_connection_past_its_maximum_age_drains_then_closes_with_1001(door):
    """``max_connection_age_s`` as on the gateway: past it, an idle connection closes with 1001; one
    with a response in flight refuses new ones (``connection_draining``), finishes it, then closes
    with 1001. A second ring's door with a short age (the module's door keeps the default)."""
    age = 0.4
    spec = DoorSpec(model_id=MODEL, model_path=str(TEST_FAST), price=2.0, host="127.0.0.1", keys=frozenset({KEY}),
                    limits=LIMITS | {"max_connection_age_s": age})
    with ShardedModel.from_pretrained(TEST_FAST, num_slots=2, max_len=512, door=spec) as aged:
        host, port = aged.door_address
        url = f"ws://{host}:{port}/v1/responses"

        async def idle() -> tuple[int, float]:
            started = time.monotonic()
            async with ws(url) as conn:
                with pytest.raises(ConnectionClosed) as closed:
                    await conn.recv()
            return closed.value.rcvd.code, time.monotonic() - started

        async def busy() -> tuple[list[dict], list[dict], int]:
            """A long response, then a second one sent once the age has passed, the head paused in
            between: the first is still in flight when the second comes."""
            async with ws(url) as conn:
                opened = time.monotonic()
                await conn.send(create("long", max_output_tokens=500, ignore_eos=True))
                events = [json.loads(await conn.recv())]
                while events[-1]["type"] != "response.output_text.delta":
                    events.append(json.loads(await conn.recv()))
                with paused(chip_processes()) as head:
                    await asyncio.sleep(max(0.0, opened + age + 0.05 - time.monotonic()))
                    await conn.send(create("late"))
                    head.reached()
                try:
                    while True:
                        e = json.loads(await conn.recv())
                        validate(e)
                        events.append(e)
                except ConnectionClosed as closed:
                    code = closed.rcvd.code
                return [e for e in events if e["id"] == "long"], [e for e in events if e["id"] == "late"], code

        code, waited = run(idle())
        assert code == 1001 and age - 0.1 <= waited < age + 5
        long, late, code = run(busy())
        assert [e["type"] for e in late] == ["error"] and late[0]["code"] == "connection_draining"
        assert long[-1]["type"] == "response.completed" and long[-1]["usage"]["output_tokens"] == 500
        assert code == 1001


def test_an_upgrade_that_never_comes_is_closed_and_a_reader_that_stops_does_not_stall_others(door):
    m, url = door
    host, port = m.door_address
    mute = socket.create_connection((host, port))
    mute.settimeout(LIMITS["header_timeout_s"] + 5)
    started = time.monotonic()
    assert mute.recv(1) == b""  # closed by the door after header_timeout_s
    assert time.monotonic() - started >= LIMITS["header_timeout_s"] - 0.1
    mute.close()

    async def main():
        stalled = await ws(url, max_queue=1)  # stops reading: the door must not wait for it
        await stalled.send(create("long", max_output_tokens=200, ignore_eos=True))
        async with ws(url) as conn:
            await conn.send(create("other"))
            events = await until_end(conn, "other")
        await stalled.close()
        return events

    assert run(main())[-1]["type"] == "response.completed"


def test_a_pipelined_rings_door_reports_each_hop_and_a_dead_chip_ends_its_responses_retryably(door):
    """pp=2 (a hop each way every step): the completed event carries the response's hops per chip
    pair, and the text is the one-chip ring's; a chip that dies ends the door's responses with
    ``lane_unavailable`` (retryable) and closes the connection with 1011."""
    tok = Tokenizer.from_file(str(TEST_FAST / "tokenizer.json"))
    want = tok.decode(hf_greedy(TEST_FAST, tok.encode(PROMPT).ids, 16))
    spec = DoorSpec(model_id=MODEL, model_path=str(TEST_FAST), price=1.0, host="127.0.0.1")
    ring = ShardedModel.from_pretrained(TEST_FAST, pp=2, num_slots=2, max_len=256, door=spec)
    try:
        url = f"ws://{ring.door_address[0]}:{ring.door_address[1]}/v1/responses"

        async def main():
            async with ws(url, key=None) as conn:
                await conn.send(create("h"))
                hops = await until_end(conn, "h")
                await conn.send(create("k", max_output_tokens=200, ignore_eos=True))
                while json.loads(await conn.recv())["type"] != "response.output_text.delta":
                    pass
                with paused(chip_processes()):  # "k" is surely in flight when the chip dies
                    ray.kill(ring._workers[1])  # the second stage's chip
                code, reason, events = await closed_with(conn)
                return hops, code, events

        hops, code, events = run(main())
    finally:
        ring.shutdown()
    assert text(hops) == want
    pairs = hops[-1]["hops"]
    assert len(pairs) == 2 and {p["src"] for p in pairs} == {p["dst"] for p in pairs}
    assert pairs[0]["count"] == pairs[1]["count"] >= 15 and all(p["bytes"] > 0 for p in pairs)
    errors = [e for e in events if e["type"] == "error"]
    assert [e["id"] for e in errors] == ["k"] and errors[0]["code"] == "lane_unavailable"
    assert errors[0]["retry_after"] > 0 and code == 1011


# -- through the app -----------------------------------------------------------------------------

@pytest.mark.slow
def test_the_gateway_hands_out_the_door_and_it_answers_as_the_gateway_does(app):
    a = app()
    r = a.client.get("/v1/door", timeout=30)
    assert r.status_code == 200, r.text
    doors = r.json()["data"]
    assert len(doors) == 1 and doors[0]["model"] == MODEL and doors[0]["url"].startswith("ws://")
    assert f"  door     {doors[0]['url']}   " in "".join(a.output)  # fastmode up prints it once ready
    assert httpx.get(a.base + "/v1/door", timeout=30).status_code == 401

    async def main():
        body = {"input": "class Stack:\n", "max_output_tokens": 24}
        async with connect(a.ws_url, additional_headers={"Authorization": f"Bearer {a.key}"}) as gw:
            await gw.send(create("g", **body))
            through_gateway = await until_end(gw, "g")
        async with ws(doors[0]["url"], key=a.key) as conn:
            await conn.send(create("d", **body))
            through_door = await until_end(conn, "d")
        async with ws(doors[0]["url"], key="sk-wrong") as conn:
            refused = await closed_with(conn)
        return through_gateway, through_door, refused

    gateway, door_, refused = run(main())
    assert a.lane_stats("fast")["door"]["served"] >= 1  # /health shows the door
    assert text(door_) == text(gateway) and text(door_)
    assert door_[-1]["usage"]["output_tokens"] == gateway[-1]["usage"]["output_tokens"]
    assert door_[-1]["cost_units"] == gateway[-1]["cost_units"]
    assert refused[0] == 1008


@pytest.mark.slow
def test_the_doors_responses_count_in_the_lanes_metrics(app):
    from tests.serve.test_metrics import scrape

    a = app()
    url = a.client.get("/v1/door", timeout=30).json()["data"][0]["url"]
    keys = ["ray_fastmode_requests_total{lane=fast,outcome=completed}", "ray_fastmode_requests_total{lane=fast,outcome=cancelled}",
            "ray_fastmode_requests_total{lane=fast,outcome=unknown_model}", "ray_fastmode_ttft_seconds_count{lane=fast}"]
    before = scrape(a.metrics_url)

    async def main():
        async with ws(url, key=a.key) as conn:
            for i in range(3):
                await conn.send(create(f"m{i}"))
                await until_end(conn, f"m{i}")
            await conn.send(create("x", model="nope"))
            await until_end(conn, "x")
            await conn.send(create("c", max_output_tokens=200, ignore_eos=True))
            await conn.send(json.dumps({"type": "response.cancel", "id": "c"}))
            await until_end(conn, "c")

    run(main())
    deadline = time.monotonic() + 60
    while True:
        after = scrape(a.metrics_url)
        grew = [after.get(k, 0) - before.get(k, 0) for k in keys]
        if grew[0] >= 3 and grew[1] >= 1 and grew[2] >= 1 and grew[3] >= 3:
            break
        assert time.monotonic() < deadline, dict(zip(keys, grew))
        time.sleep(1)


def test_an_app_with_tls_has_no_door(secure_app):
    """The door has no TLS: with ``http`` TLS the head serves none, and ``GET /v1/door`` says so."""
    a = secure_app.app
    r = a.client.get("/v1/door", timeout=30)
    assert r.status_code == 404, r.text
    body = r.json()
    assert body["code"] == "door_unavailable" and "TLS" in body["message"] and "retry_after" not in body
    status, events = a.generate(model=MODEL, input=PROMPT, max_output_tokens=4)  # the lane itself serves
    assert status == 200 and events[-1]["type"] == "done", events
