"""The gRPC API against the running application: stubs match the proto, streaming from each lane,
every status code the issue names, health and reflection, and cancellation freeing the sequence."""

from __future__ import annotations

import filecmp
import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from packaging.requirements import Requirement

from bench.soak import cancelled
from clients.grpc_client import GrpcClient, error_code, retry_after
from serve.rpc.codegen import generate
from tests.serve.conftest import REPO, text_of

LANES = {"fast": ("fastmode-fast", None), "priority": ("fastmode-full", "priority"),
         "standard": ("fastmode-full", "default"), "exact": ("fastmode-full", "exact")}


def test_committed_stubs_match_the_proto(tmp_path):
    generate(tmp_path)
    for name in ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py"):
        assert filecmp.cmp(tmp_path / "serve" / "rpc" / name, REPO / "serve" / "rpc" / name, shallow=False), name


def test_the_stubs_version_stamps_are_the_declared_floors():
    """The stubs raise at import under an older grpcio or protobuf than made them, so pyproject's floors
    must be those versions, and the pinned generator the one that made them."""
    rpc = REPO / "serve" / "rpc"
    grpc_stamp = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", (rpc / "inference_pb2_grpc.py").read_text())[1]
    proto_stamp = re.search(r"# Protobuf Python Version: ([\d.]+)", (rpc / "inference_pb2.py").read_text())[1]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {Requirement(r).name: str(Requirement(r).specifier) for r in project["dependencies"]}
    for name in ("grpcio", "grpcio-health-checking", "grpcio-reflection"):
        assert declared[name] == f">={grpc_stamp}", name
    assert declared["protobuf"] == f">={proto_stamp}"
    tools = [Requirement(r) for r in project["optional-dependencies"]["test"] if Requirement(r).name == "grpcio-tools"]
    assert [str(r.specifier) for r in tools] == [f"=={grpc_stamp}"]


class OneEvent:
    """A router whose every stream is one event."""

    def __init__(self, event: dict) -> None:
        self.event = event

    def stream(self, body: dict, owner: str = ""):
        event = self.event

        class Stream:
            def __aiter__(self):
                async def events():
                    yield event
                return events()

            def cancel(self) -> None:
                pass

        return Stream()


def call_in_process(router, message: bytes) -> grpc.aio.AioRpcError | None:
    """Send ``message`` (the serialized request, as it is) to a servicer over ``router``; its error."""
    import asyncio

    from serve.rpc import inference_pb2 as pb
    from serve.rpc.server import InferenceServicer, add_servicer

    async def main():
        server = grpc.aio.server()
        add_servicer(InferenceServicer(router, frozenset()), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_stream("/fastmode.v1.Inference/Generate", request_serializer=lambda b: b,
                                            response_deserializer=pb.GenerateChunk.FromString)
                try:
                    async for _ in call(message, timeout=10):
                        pass
                except grpc.aio.AioRpcError as e:
                    return e
        finally:
            await server.stop(0)

    return asyncio.run(main())


class Recording:
    """A router that keeps each request body and streams a created, one delta with logprobs and a done."""

    LOGPROBS = [{"token": "Hel", "id": 5, "logprob": -0.5, "top_logprobs": [{"token": "Hel", "id": 5, "logprob": -0.5},
                                                                           {"token": "Hi", "id": 6, "logprob": -1.5}]}]

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def stream(self, body: dict, owner: str = ""):
        self.bodies.append(body)
        usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2, "input_tokens_details": {"cached_tokens": 0}}
        events = [{"type": "created", "id": "r", "lane": "standard", "model": "m", "input_tokens": 1, "route": {}},
                  {"type": "delta", "id": "r", "seq": 0, "text": "Hel", "tokens": 1, "logprobs": self.LOGPROBS},
                  {"type": "done", "id": "r", "lane": "standard", "model": "m", "finish_reason": "length",
                   "usage": usage, "timing": {"total_s": 0.1}, "cost_units": 0.0}]

        class Stream:
            def __aiter__(self):
                async def gen():
                    for e in events:
                        yield e
                return gen()

            def cancel(self) -> None:
                pass

        return Stream()


def chunks_in_process(router, message: bytes) -> list:
    """The chunks a servicer over ``router`` streams for ``message`` (serialized), or its error."""
    import asyncio

    from serve.rpc import inference_pb2 as pb
    from serve.rpc.server import InferenceServicer, add_servicer

    async def main():
        server = grpc.aio.server()
        add_servicer(InferenceServicer(router, frozenset()), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_stream("/fastmode.v1.Inference/Generate", request_serializer=lambda b: b,
                                            response_deserializer=pb.GenerateChunk.FromString)
                try:
                    return [c async for c in call(message, timeout=10)]
                except grpc.aio.AioRpcError as e:
                    return e
        finally:
            await server.stop(0)

    return asyncio.run(main())


def test_chat_template_kwargs_and_logprobs_cross_grpc():
    """``chat_template_kwargs`` (a ``Struct``: JSON's values, a whole number as an int) and ``logprobs``
    reach the router as the WebSocket's fields; each chunk carries its delta's log probabilities."""
    from clients.grpc_client import request

    router = Recording()
    req = request("m", [{"role": "user", "content": "hi"}], logprobs=1,
                  chat_template_kwargs={"enable_thinking": False, "depth": 2, "ratio": 0.5, "tags": ["a", 1]})
    chunks = chunks_in_process(router, req.SerializeToString())
    assert router.bodies[0]["chat_template_kwargs"] == {"enable_thinking": False, "depth": 2, "ratio": 0.5,
                                                        "tags": ["a", 1]}
    assert isinstance(router.bodies[0]["chat_template_kwargs"]["depth"], int) and router.bodies[0]["logprobs"] == 1
    (entry,) = chunks[0].logprobs
    assert (entry.token, entry.id, entry.logprob) == ("Hel", 5, -0.5)
    assert [(t.token, t.id, t.logprob) for t in entry.top_logprobs] == [("Hel", 5, -0.5), ("Hi", 6, -1.5)]
    assert chunks[-1].last and not chunks[-1].logprobs
    router = Recording()
    chunks_in_process(router, request("m", "x").SerializeToString())
    assert not {"chat_template_kwargs", "logprobs"} & set(router.bodies[0])  # unset: not sent


@pytest.mark.parametrize("fields", [{"n": 2}, {"best_of": 3}, {"echo": True}, {"bad_words": ["x"]},
                                    {"allowed_token_ids": [1]}, {"prompt_logprobs": 0}])
def test_vllms_unserved_fields_are_unsupported_parameter_by_name(fields):
    from clients.grpc_client import request

    router = Recording()
    e = chunks_in_process(router, request("m", "x", **fields).SerializeToString())
    (name,) = fields
    assert isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(e) == "unsupported_parameter" and e.details().startswith(f"unsupported_parameter: {name}:")
    assert router.bodies == []  # never reached the router
    neutral = {"n": 1, "best_of": 1, "echo": False, "bad_words": [], "allowed_token_ids": []}
    if name in neutral:  # the neutral value changes nothing: served
        chunks = chunks_in_process(router, request("m", "x", **{name: neutral[name]}).SerializeToString())
        assert chunks[-1].last and len(router.bodies) == 1


def test_a_field_number_the_proto_does_not_have_is_unsupported_not_dropped():
    """A newer client's field (an unknown field number) would be dropped by protobuf's parser: refused."""
    from clients.grpc_client import request

    router = Recording()
    message = request("m", "x").SerializeToString() + bytes([0xC0, 0x02, 0x05])  # field 40, varint 5
    e = chunks_in_process(router, message)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and error_code(e) == "unsupported_parameter"
    assert "field number 40" in e.details() and router.bodies == []


def test_a_message_that_does_not_parse_is_invalid_argument():
    """Found by the fuzz (tests/serve/test_fuzz.py): a string field that is not UTF-8 failed the call
    with UNKNOWN (grpcio's answer when a deserializer raises)."""
    from serve.rpc import inference_pb2 as pb

    valid = pb.GenerateRequest(model="fastmode-fast", text="AAAA", max_output_tokens=1).SerializeToString()
    e = call_in_process(OneEvent({}), valid.replace(b"AAAA", b"\xff\xfe\xed\xa0"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and error_code(e) == "invalid_request"
    assert "UTF-8" in e.details()


def test_a_long_error_message_still_reaches_the_client_with_its_code():
    """Hostile input: ``unknown_model`` echoed a 20,000-character model name; over gRPC's 16 KiB trailer
    limit the client got RESOURCE_EXHAUSTED ("metadata size exceeds hard limit"), without the code."""
    from serve.errors import UnknownModel, to_event
    from serve.rpc import inference_pb2 as pb

    event = to_event(UnknownModel(f"model {'m' * 20_000!r} is not served here"))
    e = call_in_process(OneEvent(event), pb.GenerateRequest(model="m" * 20_000, text="x").SerializeToString())
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and error_code(e) == "unknown_model"


@pytest.fixture
def client(app):
    a = app()
    with GrpcClient(a.grpc_target, api_key=a.key) as c:
        yield c


@pytest.mark.slow
@pytest.mark.parametrize("lane", list(LANES))
def test_each_lane_streams_what_http_streams(app, client, lane):
    model, tier = LANES[lane]
    chunks = list(client.stream(model, "def main():\n", service_tier=tier, max_output_tokens=24, temperature=0))
    _, ref = app().generate(model=model, service_tier=tier, input="def main():\n", max_output_tokens=24, temperature=0)
    assert "".join(c.delta for c in chunks) == text_of(ref)
    texts = [c for c in chunks if not c.last]
    assert [c.seq for c in texts] == list(range(len(texts)))
    assert chunks[0].lane == lane and chunks[-1].last and chunks[-1].lane == lane
    assert chunks[-1].usage.output_tokens == 24 and chunks[-1].finish_reason == "length"
    assert chunks[-1].timing.total_s > 0 and chunks[-1].cost_units > 0
    assert chunks[-1].HasField("speculative") == (lane == "exact")
    if lane == "exact":
        assert chunks[-1].speculative.verify_steps > 0 and chunks[-1].speculative.tokens_per_step >= 1


@pytest.mark.slow
def test_list_models(client):
    assert [m["id"] for m in client.models()] == ["fastmode-full", "fastmode-fast", "auto"]


@pytest.mark.slow
@pytest.mark.parametrize("params,code", [
    ({"model": "fastmode-fast", "temperature": 9.0}, "invalid_request"),
    ({"model": "nope"}, "unknown_model"),
    ({"model": "fastmode-full", "service_tier": "flex"}, "unknown_service_tier"),
    ({"model": "fastmode-fast", "max_output_tokens": 100000}, "prompt_too_long"),
])
def test_bad_requests_are_invalid_argument_with_the_websocket_code(client, params, code):
    model = params.pop("model")
    with pytest.raises(grpc.RpcError) as e:
        list(client.stream(model, "x = 1\n", **params))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(e.value) == code and code in e.value.details()


@pytest.mark.slow
def test_a_missing_key_is_unauthenticated(app):
    with GrpcClient(app().grpc_target, api_key="") as c, pytest.raises(grpc.RpcError) as e:
        list(c.stream("fastmode-fast", "x"))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.slow
def test_an_overloaded_priority_lane_is_resource_exhausted_with_a_retry_hint(app, client):
    long = {"service_tier": "priority", "max_output_tokens": 480, "ignore_eos": True, "temperature": 0}
    calls = [client.stream("fastmode-full", "class Parser:\n", **long) for _ in range(2)]
    try:
        for call in calls:
            next(call)  # admitted and decoding
        with app().paused("priority"), pytest.raises(grpc.RpcError) as e:  # both still hold their slots
            list(client.stream("fastmode-full", "class Parser:\n", **long))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_code(e.value) == "overloaded" and retry_after(e.value) > 0
    finally:
        for call in calls:
            call.cancel()


def wait_idle(a, lane: str, before: int) -> dict:
    deadline = time.monotonic() + 30
    while (s := a.lane_stats(lane))["running"] or s["in_flight"]:
        assert time.monotonic() < deadline, s
        time.sleep(0.2)
    assert cancelled(s) == before + 1, s
    return s


@pytest.mark.slow
def test_the_deadline_is_honored_and_frees_the_sequence(app, client):
    a = app()
    # The path to the lane warm first (a gRPC replica Serve restarted, say after test_faults, links
    # to a lane on its first request): the 1 s deadline must cut the stream in the lane, not before it.
    assert client.generate("fastmode-full", "x = 1\n", max_output_tokens=2)["lane"] == "standard"
    before = cancelled(a.lane_stats("standard"))
    start = time.monotonic()
    call = client.stream("fastmode-full", "class Parser:\n", max_output_tokens=480, ignore_eos=True, timeout=2.0)
    next(call)  # streaming: the sequence is in the lane's engine when the deadline cuts it
    with a.paused("standard") as standard, pytest.raises(grpc.RpcError) as e:  # it cannot end first
        try:
            list(call)
        finally:
            standard.reached_engine()
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - start < 6
    wait_idle(a, "standard", before)


@pytest.mark.slow
def test_a_cancelled_call_frees_the_sequence(app, client):
    a = app()
    before = cancelled(a.lane_stats("fast"))
    call = client.stream("fastmode-fast", "class Parser:\n", max_output_tokens=480, ignore_eos=True)
    next(call)
    with a.paused("fast") as fast:  # the stream cannot end before the cancel reaches the head
        call.cancel()
        fast.reached_engine()
    wait_idle(a, "fast", before)


@pytest.mark.slow
def test_health_per_lane_and_overall(app):
    with grpc.insecure_channel(app().grpc_target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "fastmode.v1.Inference", "fastmode.v1.Inference/fast",
                        "fastmode.v1.Inference/priority", "fastmode.v1.Inference/standard"):
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as e:
            stub.Check(health_pb2.HealthCheckRequest(service="fastmode.v1.Inference/turbo"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.slow
def test_reflection_describes_the_service(app):
    with grpc.insecure_channel(app().grpc_target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        assert {"fastmode.v1.Inference", "grpc.health.v1.Health"} <= services
        pool = descriptor_pool.DescriptorPool(db)
        method = pool.FindServiceByName("fastmode.v1.Inference").FindMethodByName("Generate")
        assert method.server_streaming and method.output_type.full_name == "fastmode.v1.GenerateChunk"


@pytest.mark.slow
def test_grpc_chat_command(app):
    a = app()
    out = subprocess.run([sys.executable, "-m", "clients.cli", "grpc-chat", "def main():\n", "--model", "fastmode-fast",
                          "--max-tokens", "8", "--target", a.grpc_target, "--api-key", a.key, "--json"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["lane"] == "fast" and result["usage"]["output_tokens"] == 8 and result["text"]
