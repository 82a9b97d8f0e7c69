"""OpenAI's Responses API over HTTP: ``POST /v1/responses`` (the WebSocket at the same path is
``serve.websocket``), called by ``serve.gateway``.

One request becomes one router stream. Without ``stream`` the answer is one ``response`` object
(``output``: one assistant ``message`` with one ``output_text``; ``status`` ``completed``, or
``incomplete`` with ``incomplete_details.reason: max_output_tokens`` when the length limit ended
it); with it, server-sent events as OpenAI sends them: ``response.created``,
``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta``
(one per coalesced delta), ``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``, then ``response.completed`` (or ``response.incomplete``), each with
its ``sequence_number``. A failure after the stream started is an ``error`` event.

Multi-turn as OpenAI's: ``store`` defaults to true here, so every completed response can be
continued by ``previous_response_id`` (from this route, the WebSocket or gRPC: ``serve.conversation``).
``instructions`` becomes a leading ``system`` message of this request's input (as in OpenAI's API,
a previous response's instructions are not carried over); ``chat_template_kwargs`` (vLLM's) go to
the model's chat template. ``include: ["message.output_text.logprobs"]`` with ``top_logprobs`` asks
for log probabilities (``serve.request.logprobs_of``): in the ``output_text`` part's ``logprobs`` and
in each ``response.output_text.delta`` and ``.done``, OpenAI's shapes. ``usage`` has OpenAI's shape with
``input_tokens_details.cached_tokens``; a ``fastmode`` object adds lane, route, timing, cost units
(and on the exact lane ``speculative``). Errors are OpenAI's ``{"error": {...}}`` bodies, as in
``serve.openai_api``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import InvalidRequest, describe_validation, parse_json, to_event
from .lanes.lane import EXACT, PRIORITY
from .openai_api import JSONBody, _Chat, _clamp, _error_response, _extension, respond
from .openai_api import _event_response as _openai_event_response
from .openai_schema import SAMPLING, OpenAIRequestError, refuse_unimplemented
from .request import LOGPROBS_INCLUDE, logprobs_of
from .telemetry import with_traceparent


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list | None = None


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[_Part]
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ResponsesRequest(BaseModel):
    """The fields of OpenAI's ``responses.create`` that fastmode serves; any other is refused by name
    (``unsupported_parameter``) unless it holds its neutral value (``serve.openai_schema.NEUTRAL``)."""

    model_config = ConfigDict(extra="allow")
    model: str
    input: str | list[_Item]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    # Not in OpenAI's Responses API; as chat completions' (vLLM's Responses API takes them too):
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Any] | None = None
    min_tokens: int | None = None
    service_tier: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["disabled"] | None = None
    parallel_tool_calls: bool | None = None
    tools: list[Any] | None = Field(default=None, max_length=0, description="No tools are served.")
    ignore_eos: bool | None = None  # vLLM's extension
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[str] | None = None  # "message.output_text.logprobs" only (serve.request.LOGPROBS_INCLUDE)
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extension: variables for the model's chat template

    def generate_request(self, rid: str) -> dict[str, Any]:
        """The router's request (``serve.request.GenerateRequest`` fields)."""
        items = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else [
            {"role": i.role, "content": i.text} for i in self.input]
        if self.instructions:
            items.insert(0, {"role": "system", "content": self.instructions})
        body = {"id": rid, "model": self.model, "input": items, "store": self.store,
                "previous_response_id": self.previous_response_id, "max_output_tokens": self.max_output_tokens,
                **{name: getattr(self, name) for name in SAMPLING},
                "service_tier": self.service_tier,
                "metadata": self.metadata, "ignore_eos": self.ignore_eos,
                "chat_template_kwargs": self.chat_template_kwargs,
                "logprobs": logprobs_of(self.include, self.top_logprobs)}
        return {k: v for k, v in body.items() if v is not None}


async def create(router, request: Request):
    """``POST /v1/responses``."""
    try:
        data = parse_json(await request.body())
    except InvalidRequest as e:
        return _error_response(400, e.message, "invalid_request")
    if not isinstance(data, dict):
        return _error_response(400, "the body must be a JSON object", "invalid_request")
    rid = f"resp_{uuid.uuid4().hex}"
    try:
        req = ResponsesRequest.model_validate(data)
        refuse_unimplemented(req.model_extra or {})
        body = with_traceparent(req.generate_request(rid), request.headers)
    except ValidationError as e:
        return _error_response(400, describe_validation(e.errors(), "(body)"), "invalid_request",
                               str(e.errors()[0]["loc"][0]) if e.errors()[0]["loc"] else None)
    except OpenAIRequestError as e:
        return _error_response(400, e.message, e.code, e.param)
    except InvalidRequest as e:  # include, top_logprobs (serve.request.logprobs_of)
        return _error_response(400, e.message, e.code, e.message.split(":", 1)[0])
    reply = _Response(rid, req)
    return await respond(router.stream(body,
                                       owner=getattr(request.state, "owner", "")), rid, request,
                         req.stream, created=reply.created, sse=lambda stream: _sse(reply, stream), body=reply.final,
                         error=_event_response)


class _Response:
    """The ``response`` object of one request, as it goes."""

    def __init__(self, rid: str, req: ResponsesRequest) -> None:
        self.id, self.req, self.created_at = rid, req, int(time.time())
        self.msg_id = f"msg_{uuid.uuid4().hex}"
        self.model, self.service_tier = req.model, "default"

    def created(self, event: dict[str, Any]) -> None:
        self.model = event["model"]
        self.service_tier = {PRIORITY: "priority", EXACT: "exact"}.get(event["lane"], "default")

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.req.include or [])

    def part(self, text: str, logprobs: list | None = None) -> dict[str, Any]:
        """An ``output_text`` content part; with logprobs asked for, theirs (OpenAI's ``Logprob``s)."""
        part = {"type": "output_text", "text": text, "annotations": []}
        if self.wants_logprobs:
            part["logprobs"] = output_logprobs(logprobs or [])
        return part

    def message(self, text: str, status: str, logprobs: list | None = None) -> dict[str, Any]:
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                "content": [self.part(text, logprobs)]}

    def body(self, status: str, output: list, done: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.req
        out = {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
               "model": self.model, "output": output, "instructions": r.instructions,
               "previous_response_id": r.previous_response_id, "store": r.store, "service_tier": self.service_tier,
               "max_output_tokens": r.max_output_tokens, "temperature": r.temperature if r.temperature is not None else 1.0,
               "top_p": r.top_p if r.top_p is not None else 1.0, "metadata": r.metadata or {}, "error": None,
               "incomplete_details": None, "parallel_tool_calls": False, "tool_choice": "none", "tools": [],
               "truncation": "disabled", "top_logprobs": r.top_logprobs, "usage": None}
        if done is not None:
            u = done["usage"]
            out["usage"] = {"input_tokens": u["input_tokens"],
                            "input_tokens_details": {"cached_tokens": u.get("input_tokens_details", {}).get(
                                "cached_tokens", 0)},
                            "output_tokens": u["output_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": u["total_tokens"]}
            if done["finish_reason"] == "length":
                out["incomplete_details"] = {"reason": "max_output_tokens"}
            out["fastmode"] = _extension(done)
        return out

    def final(self, text: str, done: dict[str, Any]) -> dict[str, Any]:
        self.model = done["model"]
        status = "incomplete" if done["finish_reason"] == "length" else "completed"
        return self.body(status, [self.message(text, status, done.get("logprobs"))], done)


async def _sse(reply: _Response, stream) -> AsyncIterator[str]:
    """The SSE body, OpenAI's event sequence; an ``error`` event ends it after a failure."""
    seq = 0

    def event(kind: str, **fields: Any) -> str:
        nonlocal seq
        data = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    part = reply.part("")
    at = {"item_id": reply.msg_id, "output_index": 0, "content_index": 0}
    texts: list[str] = []
    logprobs: list[dict[str, Any]] = []
    try:
        yield event("response.created", response=reply.body("in_progress", []))
        yield event("response.in_progress", response=reply.body("in_progress", []))
        yield event("response.output_item.added", output_index=0, item={**reply.message("", "in_progress"),
                                                                          "content": []})
        yield event("response.content_part.added", part=part, **at)
        async for ev in stream:
            kind = ev["type"]
            if kind == "delta":
                texts.append(ev["text"])
                entries = ev.get("logprobs") or []
                logprobs += entries
                yield event("response.output_text.delta", delta=ev["text"], logprobs=delta_logprobs(entries), **at)
            elif kind == "done":
                text = "".join(texts)
                final = reply.final(text, {**ev, "logprobs": logprobs})
                yield event("response.output_text.done", text=text, logprobs=delta_logprobs(logprobs), **at)
                yield event("response.content_part.done", part=final["output"][0]["content"][0], **at)
                yield event("response.output_item.done", output_index=0, item=final["output"][0])
                yield event(f"response.{final['status']}", response=final)
                return
            elif kind == "error":
                yield event("error", code=ev["code"], message=ev["message"], param=None)
                return
        yield event("error", code="internal_error", message="the stream ended without 'done'", param=None)
    except Exception as e:  # noqa: BLE001 - mid-stream failure: the stream's last event says so
        err = to_event(e, reply.id)
        yield event("error", code=err["code"], message=err["message"], param=None)


def output_logprobs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The deltas' entries (``Lane._logprobs``) as OpenAI's ``output_text`` ``logprobs``: per token its
    ``token``, UTF-8 ``bytes``, ``logprob`` and ``top_logprobs`` alike (-inf as -9999, as chat's)."""
    return _Chat.logprobs(entries)["content"]


def delta_logprobs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries as ``response.output_text.delta``'s (and ``.done``'s) ``logprobs``: OpenAI's stream
    ``Logprob``, ``token``, ``logprob`` and ``top_logprobs`` of ``token`` and ``logprob`` (as vLLM's)."""
    return [{"token": e["token"], "logprob": _clamp(e["logprob"]),
             "top_logprobs": [{"token": t["token"], "logprob": _clamp(t["logprob"])} for t in e["top_logprobs"]]}
            for e in entries]


class _Api:
    input_param = "input"  # what an error about the prompt names as its ``param``


def _event_response(event: dict[str, Any]) -> JSONBody:
    return _openai_event_response(event, _Api())
