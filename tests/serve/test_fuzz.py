"""Hostile input at every front door of the running application, property-based (hypothesis): the
WebSocket's frames, the JSON bodies of the OpenAI routes and ``/v1/generate``, the gRPC request.

The property, for every input: a typed answer (an ``error`` event whose code docs/protocol.md lists,
an HTTP 4xx with an error body, a gRPC status other than INTERNAL or UNKNOWN), a documented close
code, or a valid response; never a 5xx, a crash or a hang (every wait is bounded); the connection
serves on afterwards; and once a front door's fuzz is over, every lane is idle (no request left an
engine sequence behind) and a normal request is served.

Requests are valid ones with up to two fields replaced by any JSON value (or removed), next to
arbitrary JSON, broken or deep text and raw bytes. A valid request's token budget is 1-3 and is never
removed or raised, so the engines' time goes to hostile input, not to long generations.
``FASTMODE_FUZZ_EXAMPLES`` sets the examples per front door (default 25, under a minute in all; e.g.
1000 for a long run). With ``FASTMODE_FUZZ_TALLY`` set to a file, each front door appends a JSON line to
it: how many inputs it sent and how each was answered (``fastmode bench fuzz`` reports them).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from clients.grpc_client import error_code
from serve.config import GatewayConfig
from serve.rpc import inference_pb2 as pb
from tests.serve.conftest import REPO
from tests.serve.test_protocol import validate
from tests.serve.test_websocket import ws

EXAMPLES = int(os.environ.get("FASTMODE_FUZZ_EXAMPLES", "25"))
TALLY = os.environ.get("FASTMODE_FUZZ_TALLY")
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
MAX_FRAME = GatewayConfig().max_frame_bytes
TIMEOUT_S = 60.0
"""The longest any one input may take to be answered: longer is a hang."""

_TABLE = (REPO / "docs" / "protocol.md").read_text().split("| code | when |")[1].split("\n\n")[0]
CODES = set(re.findall(r"^\| `(\w+)` \|", _TABLE, re.M)) - {"internal_error", "lane_unavailable"}
"""The error codes docs/protocol.md lists, less the two no input may cause (a bug; a lane down)."""

# --- strategies ----------------------------------------------------------------------------------


class Big(str):
    """A long string that a failing example shows by its length and start."""

    def __repr__(self) -> str:
        return f"Big({len(self)} chars: {str.__repr__(self[:30])}...)"


ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=40)
"""Any code points, lone surrogates included (JSON carries them as escapes)."""
NUMBERS = st.integers() | st.floats() | st.sampled_from([2**31, 2**32, 2**63 - 1, 2**63, 2**64, -(2**63) - 1,
                                                          10**40, 5e-324, 1e308])
JSON = st.recursive(st.none() | st.booleans() | NUMBERS | ANY_TEXT,
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(ANY_TEXT, kids, max_size=4),
                    max_leaves=12)
"""Any JSON value, NaN and the infinities included (Python's json writes them)."""


def _long_budget(value) -> bool:
    """Whether ``value`` passes as a token budget above 3 (or none): a long generation, not hostile input."""
    if value is None:
        return True
    try:
        return TypeAdapter(int).validate_python(value) > 3
    except (ValidationError, TypeError, ValueError):
        return False


DROP = object()
"""A mutation that removes the field."""


def broken(valid: st.SearchStrategy[dict], fields: list[str], budgets: tuple[str, ...]) -> st.SearchStrategy[dict]:
    """A valid request with up to two of its ``fields`` (or unknown ones) replaced by any JSON value or
    removed: about a third of them stay valid. A token budget in ``budgets`` is never removed or made
    long, so that valid requests stay short."""
    def apply(body: dict, mutations: list[tuple[str, object]]) -> dict:
        body = dict(body)
        for key, value in mutations:
            if key in budgets and (value is DROP or _long_budget(value)):
                continue
            if value is DROP:
                body.pop(key, None)
            else:
                body[key] = value
        return body

    mutation = st.tuples(st.sampled_from(fields) | ANY_TEXT, JSON | st.just(DROP))
    return st.builds(apply, valid, st.lists(mutation, max_size=2))


ROLES = ["system", "developer", "user", "assistant"]
MODELS = st.sampled_from(["fastmode-fast", "fastmode-full", "auto"])
TIERS = st.sampled_from([None, "auto", "default", "priority", "exact"])
TEXT = st.text(min_size=1, max_size=40)
PROMPT = TEXT | st.sampled_from(["def main():\n", Big("x" * 10_000), "\x00" * 8])
IDS = st.sampled_from(["a", "b", "dup"])  # few ids: duplicates are common
SAMPLING = {
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1, exclude_min=True),
    "stop": TEXT | st.lists(TEXT, max_size=4), "seed": st.integers(0, 2**63 - 1), "service_tier": TIERS,
    "metadata": st.dictionaries(TEXT, TEXT, max_size=3), "ignore_eos": st.booleans(),
    "allow_spill": st.booleans(),
}
GENERATE_FIELDS = ["model", "input", "max_output_tokens", "id", "previous_response_id", "store", *SAMPLING]
GENERATE = broken(st.fixed_dictionaries(
    {"model": MODELS, "max_output_tokens": st.integers(1, 3),
     "input": PROMPT | st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": PROMPT}),
                                min_size=1, max_size=3)},
    optional=SAMPLING | {"previous_response_id": IDS, "store": st.booleans()}), GENERATE_FIELDS,
    ("max_output_tokens",))
"""A ``GenerateRequest``-shaped body: ``/v1/generate``, and ``response.create`` with ``type`` and ``id``."""


def dumps(value, ascii_only: bool = True) -> str:
    """JSON text, NaN and Infinity as Python writes them; raw (not escaped) unicode where it encodes."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate: only its escape can travel
        text = json.dumps(value)
    return text


def nested(depth: int) -> str:
    return Big("[" * depth + "]" * depth)


RAW = st.sampled_from([
    "", "{oops", "NaN", "[1, 2", '{"type": "response.create"', Big("1" * 5000),  # over Python's int-digits limit
    *(nested(d) for d in (100, 900, 970, 990, 5000, 200_000)), Big('{"a":' * 3000 + "1" + "}" * 3000),
    Big('{"type": "response.create", "id": "deep", "model": "fastmode-fast", "max_output_tokens": 1, "input": '
        + "[" * 960 + "]" * 960 + "}"),
    '{"type": "response.create", "id": "n", "model": "fastmode-fast", "input": "x", "max_output_tokens": 1e999}',
    '{"type": "response.create", "id": "t", "model": "fastmode-fast", "input": "x", "temperature": NaN, '
    '"max_output_tokens": 1}',
    '{"type": "response.create", "id": "s", "model": "fastmode-fast", "input": "\\ud800", "max_output_tokens": 1}',
])
"""Text that JSON encoders would not write: broken, deep, huge or non-standard."""

# --- the WebSocket ------------------------------------------------------------------------------

CREATE = st.builds(lambda body, rid: {"type": "response.create", "id": rid, **body}, GENERATE, IDS | JSON)
CANCEL = st.builds(lambda rid: {"type": "response.cancel", "id": rid}, IDS | JSON)
EVENT = st.one_of(CREATE, CREATE, CANCEL, st.fixed_dictionaries(
    {"type": JSON | st.sampled_from(["response.fly", ""])}, optional={"id": IDS}), JSON)
FRAME = st.one_of(
    st.tuples(st.just("text"), st.builds(dumps, EVENT, st.booleans())),
    st.tuples(st.just("text"), RAW | st.text(max_size=60)),
    st.tuples(st.just("binary"), st.binary(max_size=64)),
    st.tuples(st.just("badutf8"), st.sampled_from([b"\xff\xfe", b'{"type": "\xc3"}', b"\xed\xa0\x80"])),
    st.tuples(st.just("flood"), st.integers(20, 300)),  # that many response.cancel frames at once
    st.tuples(st.just("oversize"), st.sampled_from(["text", "binary"])),
)
CLOSES = {1009: "frame_too_large", 1007: None, 1008: "rate_limited"}
"""Close codes a client may cause, each with the ``error`` event that must come first (1007: a text frame
that is not UTF-8, closed by the WebSocket layer)."""


async def _put(conn, message: str | bytes, **kw) -> None:
    """Send one message while the connection is open; once the server has closed it, raise
    ``ConnectionClosed`` without sending (the reader has the close code). Sending on a closed
    connection makes websockets abort its transport, which Python 3.11's asyncio fails with an
    ``AttributeError`` when the transport closed itself after flushing its buffer (seen under
    ``make bench``). No loop turn between this check and websockets' own."""
    if conn.protocol.state is not State.OPEN:
        raise ConnectionClosed(None, None)
    await conn.send(message, **kw)


async def _send(conn, frame: tuple[str, object]) -> None:
    kind, payload = frame
    if kind == "text":
        await _put(conn, payload)
    elif kind == "binary":
        await _put(conn, payload, text=False)
    elif kind == "badutf8":
        await _put(conn, payload, text=True)  # text frame, bytes as they are
    elif kind == "flood":
        for i in range(payload):
            await _put(conn, json.dumps({"type": "response.cancel", "id": f"f{i % 3}"}))
    else:
        big = Big("x" * (MAX_FRAME + 1))
        await _put(conn, big if payload == "text" else big.encode(), text=payload == "text")


async def exchange(a, frames: list[tuple[str, object]]) -> tuple[list[dict], int | None]:
    """Send ``frames`` on a fresh connection, then a probe; every event until the probe is answered and
    every response that started has ended (or the server closed: then its close code)."""
    probe = "probe-" + os.urandom(6).hex()
    events: list[dict] = []
    async with ws(a, max_queue=None) as conn:
        open_ids: set[str] = set()
        answered = asyncio.Event()

        async def read() -> int | None:
            try:
                while True:
                    try:  # once all is answered, wait a little for responses that start late
                        quiet = answered.is_set() and not open_ids
                        e = json.loads(await asyncio.wait_for(conn.recv(), 0.3 if quiet else None))
                    except TimeoutError:
                        return None
                    events.append(e)
                    rid = e.get("id")
                    if e["type"] == "response.created":
                        open_ids.add(rid)
                    elif e["type"] in ("response.completed", "response.cancelled") or (
                            e["type"] == "error" and e["code"] not in ("duplicate_id", "rate_limited")):
                        open_ids.discard(rid)
                    if rid == probe:
                        answered.set()
            except ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd else 1006  # 1006: no close frame

        reader = asyncio.create_task(read())
        try:
            for frame in frames:
                await _send(conn, frame)
            await _put(conn, json.dumps({"type": "response.cancel", "id": probe}))
        except ConnectionClosed:
            pass  # the server closed: the reader has its code
        code = await asyncio.wait_for(reader, TIMEOUT_S)
    if code is None:
        assert answered.is_set()
    return events, code


def check_events(events: list[dict], code: int | None) -> None:
    for e in events:
        validate(e)  # every event matches docs/protocol.schema.json
        if e["type"] == "error":
            assert e["code"] in CODES, e
    if code is not None:
        assert code in CLOSES, f"closed with {code}"
        if CLOSES[code] is not None:
            assert any(e["type"] == "error" and e["code"] == CLOSES[code] for e in events), (code, events[-3:])


async def probe(a) -> None:
    """A fresh connection answers."""
    async with ws(a) as conn:
        await conn.send(json.dumps({"type": "response.cancel", "id": "probe"}))
        e = json.loads(await asyncio.wait_for(conn.recv(), TIMEOUT_S))
        assert (e["type"], e["code"]) == ("error", "unknown_id")


@pytest.mark.slow
def test_websocket_frames(app):
    a = app()
    answers: Counter[str] = Counter()
    connections: list[int | None] = []

    @FUZZ
    @given(st.lists(FRAME, min_size=1, max_size=6))
    def one(frames):
        events, code = asyncio.run(exchange(a, frames))
        check_events(events, code)
        answers.update(ws_answers(events, code))
        connections.append(code)
        if code is not None:
            asyncio.run(probe(a))

    t = time.monotonic()
    one()
    assert_idle_and_serving(a)
    tally("websocket", answers, time.monotonic() - t, len(connections))


def ws_answers(events: list[dict], code: int | None) -> list[str]:
    """How one connection's frames were answered, once each: its error codes, responses completed, its close."""
    seen = {f"error {e['code']}" for e in events if e["type"] == "error" and not str(e.get("id")).startswith("probe-")}
    if any(e["type"] == "response.completed" for e in events):
        seen.add("response.completed")
    if code is not None:
        seen.add(f"close {code}")
    return sorted(seen) or ["nothing but the probe's answer"]


# --- HTTP ---------------------------------------------------------------------------------------

CONTENT = PROMPT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": PROMPT}), min_size=1,
                            max_size=2)
OPENAI = {"stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
          "n": st.just(1), **SAMPLING}
OPENAI_FIELDS = ["model", "max_tokens", "max_completion_tokens", "n", "logprobs", "top_logprobs", "tools",
                 "tool_choice", "response_format", "echo", "suffix", "best_of", *OPENAI]
BODIES = {
    "/v1/chat/completions": broken(st.fixed_dictionaries(
        {"model": MODELS, "max_tokens": st.integers(1, 3), "messages": st.lists(st.fixed_dictionaries(
            {"role": st.sampled_from(ROLES), "content": CONTENT}), min_size=1, max_size=3)},
        optional=OPENAI | {"max_completion_tokens": st.integers(1, 3)}), OPENAI_FIELDS + ["messages"],
        ("max_tokens", "max_completion_tokens")),
    "/v1/completions": broken(st.fixed_dictionaries(
        {"model": MODELS, "max_tokens": st.integers(1, 3), "prompt": PROMPT}, optional=OPENAI),
        OPENAI_FIELDS + ["prompt"], ("max_tokens",)),
    "/v1/responses": broken(st.fixed_dictionaries(
        {"model": MODELS, "max_output_tokens": st.integers(1, 3),
         "input": PROMPT | st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": CONTENT}),
                                    min_size=1, max_size=3)},
        optional={k: SAMPLING[k] for k in ("temperature", "top_p", "service_tier", "metadata")} | {
            "instructions": PROMPT, "previous_response_id": IDS, "store": st.booleans(), "stream": st.booleans()}),
        ["model", "max_output_tokens", "input", "instructions", "previous_response_id", "store", "stream", "tools",
         "truncation", "user", "reasoning", "temperature", "top_p", "service_tier", "metadata"],
        ("max_output_tokens",)),
    "/v1/generate": GENERATE,
}
BODY = st.sampled_from(sorted(BODIES)).flatmap(lambda route: st.tuples(st.just(route), st.one_of(
    st.builds(lambda b, ascii_only: dumps(b, ascii_only).encode(), BODIES[route], st.booleans()),
    st.builds(lambda b, ascii_only: dumps(b, ascii_only).encode(), BODIES[route], st.booleans()),
    st.builds(lambda v: dumps(v).encode(), JSON),
    RAW.map(str.encode),
    st.binary(max_size=64),
    st.just(nested(200_000)).map(str.encode))))


def check_http(route: str, r: httpx.Response, body: bytes) -> None:
    """A 4xx with an error body, or a 200 whose stream or JSON is whole and carries no internal error."""
    assert r.status_code < 500, (route, body[:300], r.status_code, r.text[:500])
    kind = r.headers.get("content-type", "")
    if r.status_code >= 400:
        err = r.json()
        if route == "/v1/generate":  # the router's error event
            assert err["type"] == "error" and err["code"] in CODES and isinstance(err["message"], str), err
        else:  # OpenAI's error object
            e = err["error"]
            assert isinstance(e["message"], str) and isinstance(e["type"], str) and e["code"] in CODES, err
        return
    assert r.status_code == 200, r.status_code
    if kind.startswith("application/json"):
        r.json()
        return
    lines = [ln for ln in r.text.splitlines() if ln]
    if kind.startswith("application/x-ndjson"):
        last = json.loads(lines[-1])
        assert last["type"] == "done" or (last["type"] == "error" and last["code"] in CODES), last
        return
    assert kind.startswith("text/event-stream"), kind
    data = [ln[6:] for ln in lines if ln.startswith("data: ")]
    last = data[-1] if data[-1] == "[DONE]" else json.loads(data[-1])
    if route == "/v1/responses":
        assert last["type"] in ("response.completed", "response.incomplete") or last.get("code") in CODES, last
    else:
        assert last == "[DONE]" or last["error"]["code"] in CODES, last


@pytest.mark.slow
def test_http_bodies(app):
    a = app()
    client = httpx.Client(base_url=a.base, timeout=TIMEOUT_S, headers={"Authorization": f"Bearer {a.key}",
                                                                        "Content-Type": "application/json"})

    answers: Counter[str] = Counter()

    @FUZZ
    @given(BODY)
    def one(route_body):
        route, body = route_body
        r = client.post(route, content=body)
        check_http(route, r, body)
        answers[f"{r.status_code} {http_code(r)}".rstrip()] += 1

    t = time.monotonic()
    with client:
        one()
    assert_idle_and_serving(a)
    tally("http", answers, time.monotonic() - t)


def http_code(r: httpx.Response) -> str:
    """fastmode's error code in a 4xx body (OpenAI's error object, or ``/v1/generate``'s error event)."""
    if r.status_code < 400:
        return ""
    body = r.json()
    return (body.get("error") or body).get("code", "")


# --- gRPC ---------------------------------------------------------------------------------------

UTF8 = st.text(max_size=40) | st.just(Big("m" * 20_000))  # any UTF-8 (protobuf's strings), or long
GRPC_VALID = st.fixed_dictionaries(
    {"model": MODELS, "max_output_tokens": st.integers(1, 3), "text": PROMPT},
    optional=SAMPLING | {"id": IDS, "previous_response_id": IDS, "store": st.booleans()})
GRPC_JUNK = {"id": UTF8, "model": UTF8, "service_tier": UTF8, "text": UTF8,
             "messages": st.lists(st.tuples(st.sampled_from(ROLES) | UTF8, UTF8), max_size=3),
             "max_output_tokens": st.sampled_from([0, 2**32 - 1, 100_000]), "temperature": st.floats(),
             "top_p": st.floats(), "stop": st.lists(UTF8, max_size=6), "seed": st.integers(0, 2**64 - 1),
             "metadata": st.dictionaries(UTF8, UTF8, max_size=3), "previous_response_id": UTF8}
GRPC_REQUEST = st.builds(lambda body, junk: body | junk, GRPC_VALID,
                         st.fixed_dictionaries({}, optional=GRPC_JUNK).filter(lambda junk: len(junk) <= 2))
"""A valid request with up to two fields given any value their proto type allows."""


def to_proto(fields: dict) -> bytes:
    fields = {k: [v] if k == "stop" and isinstance(v, str) else v for k, v in fields.items() if v is not None}
    messages = fields.pop("messages", None)
    metadata = fields.pop("metadata", {})
    req = pb.GenerateRequest(**fields)
    if messages is not None:
        req.messages.messages.extend(pb.Message(role=r, content=c) for r, c in messages)
    for k, v in metadata.items():
        req.metadata[k] = v
    return req.SerializeToString()


VALID = pb.GenerateRequest(model="fastmode-fast", text="AAAA", max_output_tokens=1).SerializeToString()
GRPC_MESSAGE = st.one_of(GRPC_REQUEST.map(to_proto), st.binary(max_size=64),
                         st.just(VALID.replace(b"AAAA", b"\xff\xfe\xed\xa0")))  # a string field not UTF-8
GRPC_OK = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.mark.slow
def test_grpc_messages(app):
    a = app()
    with grpc.insecure_channel(a.grpc_target) as channel:
        call = channel.unary_stream("/fastmode.v1.Inference/Generate", request_serializer=lambda b: b,
                                    response_deserializer=pb.GenerateChunk.FromString)

        answers: Counter[str] = Counter()

        @FUZZ
        @given(GRPC_MESSAGE)
        def one(message):
            chunks: Iterator = call(message, timeout=TIMEOUT_S, metadata=(("authorization", f"Bearer {a.key}"),))
            try:
                assert list(chunks)[-1].last
                answers["OK"] += 1
            except grpc.RpcError as e:  # a typed status, with fastmode's code in its trailers
                assert e.code() in GRPC_OK and error_code(e) in CODES, (e.code(), e.details(), message[:200])
                answers[f"{e.code().name} {error_code(e)}"] += 1

        t = time.monotonic()
        one()
    assert_idle_and_serving(a)
    tally("grpc", answers, time.monotonic() - t)


# --- afterwards ---------------------------------------------------------------------------------


def tally(door: str, answers: Counter[str], seconds: float, inputs: int | None = None) -> None:
    """Append this front door's answers to ``FASTMODE_FUZZ_TALLY`` (when set): one JSON line. ``inputs``:
    how many were sent (default: one answer each)."""
    if TALLY:
        with open(TALLY, "a") as f:
            f.write(json.dumps({"front_door": door, "examples": EXAMPLES,
                                "inputs": sum(answers.values()) if inputs is None else inputs,
                                "seconds": round(seconds, 1), "answers": dict(answers.most_common())}) + "\n")


def assert_idle_and_serving(a) -> None:
    """Every lane has nothing running or in flight (no request leaked its engine sequence), the
    gateway's router has nothing in flight and no WebSocket open (every session ended with its
    client), and a normal request is served."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        status, health = a.health()
        busy = {lane: s for lane, s in health["lanes"].items()
                if s.get("running") or s.get("in_flight") or s.get("front_door_in_flight")}
        if status == 200 and not busy and not health["websocket_connections"]:
            break
        assert time.monotonic() < deadline, (status, busy or health)
        time.sleep(0.5)
    status, events = a.generate(model="fastmode-fast", input="def main():\n", max_output_tokens=2)
    assert status == 200 and events[-1]["type"] == "done", events
