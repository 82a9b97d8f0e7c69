"""``GrpcServer``: the internal gRPC API, a ``grpc.aio`` server inside a Serve deployment.

Why not Ray Serve's own gRPC ingress: it serves Serve's health and routing services, not the
standard ``grpc.health.v1`` health service or server reflection that stock tools (grpcurl,
grpc_health_probe, Kubernetes gRPC probes) expect, and it routes by an ``application`` metadata
key our callers should not need. A ``grpc.aio`` server in a one-replica deployment gives full
control of statuses, deadlines, trailers and metadata, and costs one extra process hop exactly
like the HTTP gateway (see docs/grpc.md).

The servicer relays the router's events: deltas become chunks (``seq`` from 0), ``done`` the last
chunk, ``error`` a status with the WebSocket error code in the details. A request message that does
not parse (a string field that is not UTF-8, say) is INVALID_ARGUMENT too (``invalid_request``), not
the UNKNOWN that grpcio answers when a deserializer raises.

The port speaks TLS (``grpc.ssl_server_credentials``) when ``grpc.tls_certfile`` and
``grpc.tls_keyfile`` are set, and refuses to start beyond loopback without API keys
(``serve.auth.load_keys``), as the gateway does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sharding import cpus

from .. import telemetry
from ..auth import insecure_warning, key_of, load_keys, owner_of
from ..config import GrpcConfig, load_config
from ..lanes.lane import LANES
from ..router import Router
from . import inference_pb2 as pb
from . import inference_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
SERVICE = pb.DESCRIPTOR.services_by_name["Inference"].full_name  # "fastmode.v1.Inference"
HEALTH_INTERVAL_S = 2.0

# The WebSocket error codes that are the caller's fault map to INVALID_ARGUMENT.
_STATUS = {"overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED, "lane_unavailable": grpc.StatusCode.UNAVAILABLE,
           "internal_error": grpc.StatusCode.INTERNAL, "kv_cache_full": grpc.StatusCode.UNAVAILABLE,
           "not_enough_chips": grpc.StatusCode.UNAVAILABLE}


def lane_service(lane: str) -> str:
    """The health-check service name of one lane, e.g. ``fastmode.v1.Inference/fast``."""
    return f"{SERVICE}/{lane}"


NOT_SERVED = {"n": 1, "best_of": 1, "echo": False, "bad_words": [], "allowed_token_ids": [], "prompt_logprobs": None}
"""The request's fields of vLLM's ``SamplingParams`` this server does not implement, each with its
neutral value (unset is neutral too): any other value is refused by name (``unsupported``)."""


def unsupported(req: pb.GenerateRequest) -> str | None:
    """Why ``req`` asks for what this server does not serve (a field of ``NOT_SERVED`` at another value,
    or a field number this proto does not have: a newer client's field would be dropped), or ``None``."""
    for name, neutral in NOT_SERVED.items():
        if req.DESCRIPTOR.fields_by_name[name].has_presence and not req.HasField(name):
            continue  # unset
        value = list(getattr(req, name)) if isinstance(neutral, list) else getattr(req, name)
        if value != neutral:
            return f"{name}: not supported by this server (got {value!r:.80})"
    unknown = UnknownFieldSet(req)
    if len(unknown):
        numbers = sorted({f.field_number for f in unknown})
        return (f"field number {numbers[0]}: not a field of {req.DESCRIPTOR.full_name} on this server "
                "(a newer client's?); it is not served")
    return None


def _integral(value: Any) -> Any:
    """A ``Struct``'s value as JSON would give it: a number without a fraction as an ``int``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def to_request(req: pb.GenerateRequest, metadata: dict[str, str]) -> dict[str, Any]:
    """The router's request dict (``serve.request.GenerateRequest`` fields) for a proto request."""
    body: dict[str, Any] = {"model": req.model, "stop": list(req.stop) or None, "ignore_eos": req.ignore_eos,
                            "allow_spill": req.allow_spill, "store": req.store}
    if req.id:
        body["id"] = req.id
    if req.WhichOneof("input") == "messages":
        body["input"] = [{"role": m.role, "content": m.content} for m in req.messages.messages]
    else:
        body["input"] = req.text
    for field in ("service_tier", "max_output_tokens", "temperature", "top_p", "top_k", "min_p",
                  "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "previous_response_id",
                  "logprobs"):
        if req.HasField(field):
            body[field] = getattr(req, field)
    if req.logit_bias:
        body["logit_bias"] = dict(req.logit_bias)
    if req.stop_token_ids:
        body["stop_token_ids"] = list(req.stop_token_ids)
    if req.min_tokens:
        body["min_tokens"] = req.min_tokens
    if req.HasField("chat_template_kwargs"):
        body["chat_template_kwargs"] = _integral(json_format.MessageToDict(req.chat_template_kwargs))
    meta = dict(req.metadata)
    if "traceparent" in metadata:  # the call's own trace context wins
        meta["traceparent"] = metadata["traceparent"]
    if meta:
        body["metadata"] = meta
    return body


def _lenient(parse):
    """A request deserializer that hands a message that does not parse to the servicer (as its
    ``DecodeError``), which answers INVALID_ARGUMENT; grpcio fails the call with UNKNOWN when a
    deserializer raises."""
    def deserialize(data: bytes):
        try:
            return parse(data)
        except DecodeError as e:
            return e

    return deserialize


def add_servicer(servicer: pb_grpc.InferenceServicer, server: grpc.aio.Server) -> None:
    """``pb_grpc.add_InferenceServicer_to_server`` with ``_lenient`` request deserializers (the
    generated code stays the source of the methods and their types)."""
    class Capture:
        def add_generic_rpc_handlers(self, handlers) -> None:
            pass

        def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
            self.handlers = handlers

    capture = Capture()
    pb_grpc.add_InferenceServicer_to_server(servicer, capture)
    handlers = {name: h._replace(request_deserializer=_lenient(h.request_deserializer))
                for name, h in capture.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


class InferenceServicer(pb_grpc.InferenceServicer):
    def __init__(self, router, keys: frozenset[str]) -> None:
        self.router, self.keys = router, keys

    async def _check(self, request, context: grpc.aio.ServicerContext) -> tuple[dict[str, str], str]:
        """The call's metadata and its key's owner (``serve.auth.owner_of``), once its key is checked and
        its request parsed (else the call is aborted)."""
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        key = key_of(self.keys, metadata.get("authorization"))
        if key is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong API key "
                                "(metadata authorization: Bearer KEY)")
        if isinstance(request, DecodeError):
            context.set_trailing_metadata((("fastmode-error-code", "invalid_request"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid_request: the request message does "
                                f"not parse: {request}")
        if isinstance(request, pb.GenerateRequest) and (why := unsupported(request)) is not None:
            context.set_trailing_metadata((("fastmode-error-code", "unsupported_parameter"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported_parameter: {why}")
        return metadata, owner_of(key)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        metadata, owner = await self._check(request, context)
        stream = self.router.stream(to_request(request, metadata), owner=owner)
        seq, lane, model, finished = 0, "", "", False
        try:
            async for ev in stream:
                kind = ev["type"]
                if kind == "created":
                    lane, model = ev["lane"], ev["model"]
                    rid = ev["id"]
                elif kind == "delta":
                    chunk = pb.GenerateChunk(id=ev["id"], seq=seq, delta=ev["text"])
                    if ev.get("logprobs"):
                        chunk.logprobs.extend(_logprob(e) for e in ev["logprobs"])
                    if seq == 0:
                        chunk.lane, chunk.model = lane, model
                    seq += 1
                    yield chunk
                elif kind == "done":
                    finished = True
                    t = ev["timing"]
                    timing = pb.Timing(total_s=t["total_s"], **{k: t[k] for k in ("ttft_s", "engine_ttft_s",
                                                                                  "decode_tokens_per_s")
                                                               if t.get(k) is not None})
                    spec = pb.Speculative(**ev["speculative"]) if "speculative" in ev else None
                    yield pb.GenerateChunk(id=rid, seq=seq, last=True, lane=ev["lane"], model=ev["model"],
                                           usage=_usage(ev["usage"]), timing=timing,
                                           finish_reason=ev["finish_reason"], cost_units=ev["cost_units"],
                                           speculative=spec)
                elif kind == "error":
                    finished = True
                    trailers = [("fastmode-error-code", ev["code"])]
                    if ev.get("retry_after") is not None:
                        trailers.append(("retry-after", f"{ev['retry_after']:g}"))
                    context.set_trailing_metadata(tuple(trailers))
                    await context.abort(_STATUS.get(ev["code"], grpc.StatusCode.INVALID_ARGUMENT),
                                        f"{ev['code']}: {ev['message']}")
        finally:
            if not finished:  # cancelled, deadline exceeded, or the client went away
                stream.cancel()

    async def ListModels(self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext):
        await self._check(request, context)
        models = self.router.models()
        return pb.ListModelsResponse(models=[pb.Model(id=m["id"], lanes=m["lanes"]) for m in models])


class GrpcServer:
    """A Serve deployment (one replica) that runs the gRPC server on ``grpc.host:grpc.port``.

    Args:
        config: the validated deployment config (as a dict).
        fast, priority, standard, exact: the lane deployments' handles (its own ``Router`` streams from them).
        stored: the ``StoredResponses`` deployment's handle (``store: true`` responses).
    """

    async def __init__(self, config: dict[str, Any], fast, priority, standard, exact, stored=None) -> None:
        telemetry.setup("grpc")
        self.config = load_config(config)
        cpus.place("serving", self.config.cpus)
        keys = load_keys(self.config)  # refuses a non-loopback bind without keys
        if warning := insecure_warning(self.config, keys):
            log.warning(warning)
        self.router = router = Router(self.config, fast, priority, standard, exact, stored)
        router.start_warmup()  # the health service says SERVING once every lane is warm
        self.server = grpc.aio.server()
        add_servicer(InferenceServicer(router, keys), self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server)
        address = f"{self.config.grpc.host}:{self.config.grpc.port}"
        if (self.server.add_secure_port(address, credentials(self.config.grpc)) if self.config.grpc.tls
                else self.server.add_insecure_port(address)) == 0:
            raise RuntimeError(f"cannot bind the gRPC port {address}")
        await self.server.start()
        await self._set_health(await self.router.stats())
        self._watch = asyncio.get_running_loop().create_task(self._watch_health())

    async def _set_health(self, stats: dict[str, Any]) -> None:
        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        for lane in LANES:
            ok = stats["lanes"][lane]["ready"]
            await self.health.set(lane_service(lane), serving if ok else not_serving)
        ok = stats["status"] == "ok"
        for name in ("", SERVICE):  # "" is the overall health
            await self.health.set(name, serving if ok else not_serving)

    async def _watch_health(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            with contextlib.suppress(Exception):
                await self._set_health(await self.router.stats())

    async def check_health(self) -> None:
        if self._watch.done():
            raise RuntimeError("the gRPC health watcher stopped")


def credentials(config: GrpcConfig) -> grpc.ServerCredentials:
    """The server's TLS credentials from ``grpc.tls_certfile`` and ``grpc.tls_keyfile`` (PEM)."""
    cert, key = Path(config.tls_certfile).read_bytes(), Path(config.tls_keyfile).read_bytes()
    return grpc.ssl_server_credentials([(key, cert)])


def _logprob(e: dict[str, Any]) -> pb.TokenLogprob:
    """A delta's logprobs entry (``Lane._logprobs``) as its proto."""
    return pb.TokenLogprob(token=e["token"], id=e["id"], logprob=e["logprob"],
                           top_logprobs=[pb.TopLogprob(token=t["token"], id=t["id"], logprob=t["logprob"])
                                         for t in e["top_logprobs"]])


def _usage(u: dict) -> pb.Usage:
    return pb.Usage(input_tokens=u["input_tokens"], output_tokens=u["output_tokens"], total_tokens=u["total_tokens"],
                    cached_tokens=u.get("input_tokens_details", {}).get("cached_tokens", 0))
