"""OpenAI-compatible routes over the router: ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions`` (called by ``serve.gateway``).

Each request becomes one router stream (``serve.request`` events). Without ``stream`` the answer is
one ``chat.completion`` / ``text_completion`` object; with it, server-sent events: one
``data: {chunk}`` per coalesced ``delta`` (the first chat chunk carries ``role: "assistant"``), a
last chunk with the ``finish_reason``, a usage chunk with empty ``choices`` if
``stream_options.include_usage``, then ``data: [DONE]``.

Every object has OpenAI's shape plus ``service_tier`` (``"priority"`` on the priority lane,
``"exact"`` on the exact lane, else ``"default"``); the answer's ``model`` is the model that served it
(``auto`` names the one chosen). The last chunk, and a whole response, also carry a ``fastmode``
object: lane, route, timing, cost_units, and on the exact lane ``speculative`` (its drafts and their
acceptance). Usage is always in a whole response.

Errors use OpenAI's body, ``{"error": {message, type, param, code}}``, with the router's HTTP status
and code (``Retry-After`` on 429). A request refused before anything streamed gets a plain HTTP
error; an error after the stream started is sent as ``data: {"error": ...}`` and ends the stream.
A client that goes away (or any early exit) cancels the router stream, freeing the engine sequence.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .errors import InvalidRequest, clip, first_event, parse_json, to_event
from .telemetry import with_traceparent
from .lanes.lane import EXACT, PRIORITY
from .openai_schema import ChatCompletionRequest, CompletionRequest, OpenAIRequestError, parse


class JSONBody(JSONResponse):
    """A JSON response written as ASCII, non-ASCII escaped (as the SSE and WebSocket events are): an
    error message that echoes a request's field name may hold a lone surrogate (JSON can carry one as
    an escape), which UTF-8, Starlette's encoding, cannot encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


CLIENT_GONE = 499
"""The status logged for a request whose client hung up before its answer (nginx's; never received)."""

# HTTP status -> OpenAI's error ``type``.
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
                408: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}
# The router's field names (which start its ``invalid_request`` messages) -> this API's.
_PARAMS = {"max_output_tokens": "max_tokens"}
_CODE_PARAMS = {"unknown_model": "model", "unknown_service_tier": "service_tier"}


async def list_models(router) -> JSONBody:
    models = router.models()
    return JSONBody({"object": "list", "data": [
        {"id": m["id"], "object": "model", "created": 0, "owned_by": "fastmode", "lanes": m["lanes"]}
        for m in models]})


async def chat_completions(router, request: Request):
    return await _complete(router, request, _Chat())


async def completions(router, request: Request):
    return await _complete(router, request, _Text())


class _Chat:
    """The chat API's objects."""

    request_type = ChatCompletionRequest
    prefix, input_param = "chatcmpl-", "messages"
    object, chunk_object = "chat.completion", "chat.completion.chunk"

    def choice(self, text: str, finish_reason: str | None, logprobs: list | None = None) -> dict[str, Any]:
        return {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": self.logprobs(logprobs), "finish_reason": finish_reason}

    def chunk_choice(self, text: str | None, finish_reason: str | None, first: bool,
                     logprobs: list | None = None) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": self.logprobs(logprobs), "finish_reason": finish_reason}

    @staticmethod
    def logprobs(entries: list | None, offset: int = 0) -> dict[str, Any] | None:
        """OpenAI's ``choice.logprobs`` of the deltas' entries (``Lane._logprobs``): ``content``, one per
        token with its ``top_logprobs``, each with its UTF-8 ``bytes``."""
        if entries is None:
            return None

        def one(e: dict[str, Any]) -> dict[str, Any]:
            return {"token": e["token"], "logprob": _clamp(e["logprob"]), "bytes": list(e["token"].encode())}

        return {"content": [{**one(e), "top_logprobs": [one(t) for t in e["top_logprobs"]]} for e in entries],
                "refusal": None}


class _Text:
    """The (legacy) completions API's objects."""

    request_type = CompletionRequest
    prefix, input_param = "cmpl-", "prompt"
    object, chunk_object = "text_completion", "text_completion"

    def choice(self, text: str, finish_reason: str | None, logprobs: list | None = None,
               offset: int = 0) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": self.logprobs(logprobs, offset), "finish_reason": finish_reason}

    def chunk_choice(self, text: str | None, finish_reason: str | None, first: bool,
                     logprobs: list | None = None, offset: int = 0) -> dict[str, Any]:
        return self.choice(text or "", finish_reason, logprobs, offset)

    @staticmethod
    def logprobs(entries: list | None, offset: int = 0) -> dict[str, Any] | None:
        """The completions API's ``logprobs``: ``tokens``, ``token_logprobs``, ``top_logprobs`` (per token
        a map of the token and the most likely ones to theirs, as OpenAI's and vLLM's: up to
        ``logprobs + 1``) and ``text_offset`` (each token's text's start, from ``offset``)."""
        if entries is None:
            return None
        offsets = []
        for e in entries:
            offsets.append(offset)
            offset += len(e["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [_clamp(e["logprob"]) for e in entries],
                "top_logprobs": [{e["token"]: _clamp(e["logprob"])} | {t["token"]: _clamp(t["logprob"])
                                                                       for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets}


def _clamp(logprob: float) -> float:
    """A log probability JSON can carry: ``-inf`` as -9999, as OpenAI's and vLLM's servers."""
    return max(logprob, -9999.0)


async def _complete(router, request: Request, api: _Chat | _Text):
    """Run one request through the router; a JSON response, or an SSE stream if it asked for one."""
    try:
        data = parse_json(await request.body())
    except InvalidRequest as e:
        return _error_response(400, e.message, "invalid_request")
    rid = f"{api.prefix}{uuid.uuid4().hex}"
    try:
        req = parse(api.request_type, data)
        body = with_traceparent(req.generate_request(rid), request.headers)
    except OpenAIRequestError as e:
        return _error_response(400, e.message, e.code, e.param)
    reply = _Reply(api, rid, int(time.time()), req.include_usage, logprobs="logprobs" in body)
    stream = router.stream(body, owner=getattr(request.state, "owner", ""))
    return await respond(stream, rid, request, req.stream, created=reply.created_event,
                         sse=lambda stream: _sse(reply, stream), body=reply.response,
                         error=lambda event: _event_response(event, api))


async def respond(stream, rid: str, request: Request, streaming: bool, *, created, sse, body, error) -> Response:
    """What every OpenAI route does with a router stream: an error before anything streamed is a
    plain HTTP error (``error(event)``); else ``created(first event)``, then either an SSE response
    that owns the stream (``sse(stream)``'s chunks; it cancels the stream when the client goes) or
    the whole text collected into ``body(text, done)`` (``error(event)`` if it ended in one)."""
    handed_off = False  # once the SSE response owns the stream, it cancels it
    try:
        first = await first_event(stream, rid)
        if first["type"] == "error":  # refused before anything streamed: a plain HTTP error
            return error(first)
        created(first)
        if streaming:
            handed_off = True
            return ClosingStream(sse(stream), on_close=stream.cancel)
        text, done = await collect(stream, rid, request)
        if done is None:
            return Response(status_code=CLIENT_GONE)
        if done["type"] == "error":
            return error(done)
        return JSONBody(body(text, done))
    finally:
        if not handed_off:
            stream.cancel()  # a client that hung up, or an error: free the engine sequence


async def collect(stream, rid: str, request: Request | None = None) -> tuple[str, dict[str, Any] | None]:
    """A router stream's whole text and its ``done`` event (with ``logprobs``, every delta's, when they
    carried any), or its ``error`` event (then the text is what came before it).

    With ``request``, reading stops as soon as its client hangs up, and the event is ``None``: a
    whole (not streamed) response otherwise holds its engine sequence to the end for nobody. The
    caller cancels the stream, as after any early exit."""
    reading = asyncio.ensure_future(_read_all(stream, rid))
    if request is None:
        return await reading
    gone = asyncio.ensure_future(_hung_up(request))
    try:
        await asyncio.wait((reading, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not reading.done():  # the client hung up (or this handler was cancelled)
            reading.cancel()
    if reading.done() and not reading.cancelled():
        return reading.result()
    await asyncio.gather(reading, return_exceptions=True)  # the cancelled read has closed the stream
    return "", None


async def _hung_up(request: Request) -> None:
    """Return once the client of ``request`` (whose body has been read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _read_all(stream, rid: str) -> tuple[str, dict[str, Any]]:
    texts: list[str] = []
    logprobs: list[dict[str, Any]] = []
    try:
        async for event in stream:
            if event["type"] == "delta":
                texts.append(event["text"])
                logprobs += event.get("logprobs") or []
            elif event["type"] == "done":
                return "".join(texts), {**event, "logprobs": logprobs} if logprobs else event
            elif event["type"] == "error":
                return "".join(texts), event
    except Exception as e:  # noqa: BLE001
        return "".join(texts), to_event(e, rid)
    return "".join(texts), to_event(RuntimeError("the stream ended without 'done'"), rid)


class _Reply:
    """Builds the response objects of one request."""

    def __init__(self, api: _Chat | _Text, rid: str, created: int, include_usage: bool,
                 logprobs: bool = False) -> None:
        self.api, self.id, self.created, self.include_usage = api, rid, created, include_usage
        self.model, self.service_tier = None, "default"
        self.wants_logprobs = logprobs
        self.text_offset = 0
        """Characters of the tokens' texts streamed so far (completions' ``text_offset``)."""

    def created_event(self, event: dict[str, Any]) -> None:
        self.model = event["model"]
        self.service_tier = {PRIORITY: "priority", EXACT: "exact"}.get(event["lane"], "default")

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "service_tier": self.service_tier, "system_fingerprint": None}

    def response(self, text: str, done: dict[str, Any]) -> dict[str, Any]:
        """The whole (non-streamed) response object."""
        self.model = done["model"]
        logprobs = done.get("logprobs", []) if self.wants_logprobs else None
        return {**self._head(self.api.object), "choices": [self.api.choice(text, done["finish_reason"], logprobs)],
                "usage": _usage(done), "fastmode": _extension(done)}

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False,
              done: dict[str, Any] | None = None, logprobs: list | None = None) -> str:
        choice = self.api.chunk_choice(text, finish_reason, first)
        if logprobs is not None:
            choice["logprobs"] = self.api.logprobs(logprobs, self.text_offset)
            self.text_offset += sum(len(e["token"]) for e in logprobs)
        obj = {**self._head(self.api.chunk_object), "choices": [choice]}
        if self.include_usage:
            obj["usage"] = None
        if done is not None:
            obj["fastmode"] = _extension(done)
        return _sse_data(obj)

    def usage_chunk(self, done: dict[str, Any]) -> str:
        return _sse_data({**self._head(self.api.chunk_object), "choices": [], "usage": _usage(done)})


class ClosingStream(StreamingResponse):
    """A streamed response (SSE by default; the gateway's NDJSON too) that calls ``on_close`` however
    it ends. The body generator's own ``finally`` is not enough: it never runs when the client hangs
    up before the body started, and when the client hangs up while a write waits for it (it stopped
    reading), the write is what gets cancelled, the generator stays suspended at its ``yield``, and
    its ``finally`` runs only once the garbage collector finalizes it, which may be seconds later, by
    which time a short response may have finished and its engine sequence run on
    (``tests/serve/test_openai.py``)."""

    def __init__(self, content: AsyncIterator[str], on_close, media_type: str = "text/event-stream") -> None:
        super().__init__(content, media_type=media_type,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()  # a client that hung up: free the engine sequence


async def _sse(reply: _Reply, stream) -> AsyncIterator[str]:
    """The SSE body: chunks from the router's events; an error event ends it without ``[DONE]``."""
    first = True
    try:
        async for event in stream:
            kind = event["type"]
            if kind == "delta":
                yield reply.chunk(event["text"], first=first, logprobs=event.get("logprobs"))
                first = False
            elif kind == "done":
                text = "" if first or isinstance(reply.api, _Text) else None  # chat: an empty delta
                yield reply.chunk(text, event["finish_reason"], first, event)
                if reply.include_usage:
                    yield reply.usage_chunk(event)
                yield "data: [DONE]\n\n"
                return
            elif kind == "error":
                yield _sse_data({"error": _error_body(event, reply.api)})
                return
        yield _sse_data({"error": _error_body(to_event(RuntimeError("the stream ended without 'done'"),
                                                       reply.id), reply.api)})
    except Exception as e:  # noqa: BLE001 - mid-stream failure: the stream's last event says so
        yield _sse_data({"error": _error_body(to_event(e, reply.id), reply.api)})


def _sse_data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _usage(done: dict[str, Any]) -> dict[str, int]:
    u = done["usage"]
    return {"prompt_tokens": u["input_tokens"], "completion_tokens": u["output_tokens"],
            "total_tokens": u["total_tokens"],
            "prompt_tokens_details": {"cached_tokens": u.get("input_tokens_details", {}).get("cached_tokens", 0)}}


def _extension(done: dict[str, Any]) -> dict[str, Any]:
    ext = {"lane": done["lane"], "route": done.get("route"), "timing": done.get("timing"),
           "cost_units": done.get("cost_units")}
    if "speculative" in done:
        ext["speculative"] = done["speculative"]
    return ext


def _error_body(event: dict[str, Any], api: _Chat | _Text) -> dict[str, Any]:
    """OpenAI's ``error`` object for a router ``error`` event."""
    status, code, message = event["status"], event["code"], event["message"]
    param = _CODE_PARAMS.get(code)
    if code == "prompt_too_long":
        param = api.input_param
    elif code in ("invalid_request", "unsupported_parameter") and (m := re.match(r"(\w+)[.:]", message)):
        param = _PARAMS.get(m[1], api.input_param if m[1] == "input" else m[1])
    return {"message": message, "type": _ERROR_TYPES.get(status, "server_error"), "param": param,
            "code": code}


def _event_response(event: dict[str, Any], api: _Chat | _Text) -> JSONBody:
    retry = event.get("retry_after")
    headers = None if retry is None else {"Retry-After": str(max(1, round(retry)))}
    return JSONBody({"error": _error_body(event, api)}, status_code=event["status"], headers=headers)


def _error_response(status: int, message: str, code: str, param: str | None = None) -> JSONBody:
    return JSONBody({"error": {"message": clip(message), "type": _ERROR_TYPES.get(status, "server_error"),
                               "param": param and clip(param), "code": code}}, status_code=status)

