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
a previous response's instructions are not carried over). ``usage`` has OpenAI's shape with
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
from .openai_api import JSONBody, _error_response, _extension, respond
from .openai_api import _event_response as _openai_event_response
from .openai_schema import SAMPLING, OpenAIRequestError, refuse_unimplemented
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
                "metadata": self.metadata, "ignore_eos": self.ignore_eos}
        return {k: v for k, v in body.items() if v is not None}


async def create(router, request: Request):
    """``POST /v1/responses``."""
    try:
        data = parse_json(await request.body())
    except InvalidRequest as e:
        return _error_response(400, e.message, "invalid_request")
    if not isinstance(data, dict):
        return _error_response(400, "the body must be a JSON object", "invalid_request")
    try:
        req = ResponsesRequest.model_validate(data)
        refuse_unimplemented(req.model_extra or {})
    except ValidationError as e:
        return _error_response(400, describe_validation(e.errors(), "(body)"), "invalid_request",
                               str(e.errors()[0]["loc"][0]) if e.errors()[0]["loc"] else None)
    except OpenAIRequestError as e:
        return _error_response(400, e.message, e.code, e.param)
    rid = f"resp_{uuid.uuid4().hex}"
    reply = _Response(rid, req)
    return await respond(router.stream(with_traceparent(req.generate_request(rid), request.headers),
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

    def message(self, text: str, status: str) -> dict[str, Any]:
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}

    def body(self, status: str, output: list, done: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.req
        out = {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
               "model": self.model, "output": output, "instructions": r.instructions,
               "previous_response_id": r.previous_response_id, "store": r.store, "service_tier": self.service_tier,
               "max_output_tokens": r.max_output_tokens, "temperature": r.temperature if r.temperature is not None else 1.0,
               "top_p": r.top_p if r.top_p is not None else 1.0, "metadata": r.metadata or {}, "error": None,
               "incomplete_details": None, "parallel_tool_calls": False, "tool_choice": "none", "tools": [],
               "truncation": "disabled", "usage": None}
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
        return self.body(status, [self.message(text, status)], done)


async def _sse(reply: _Response, stream) -> AsyncIterator[str]:
    """The SSE body, OpenAI's event sequence; an ``error`` event ends it after a failure."""
    seq = 0

    def event(kind: str, **fields: Any) -> str:
        nonlocal seq
        data = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    part = {"type": "output_text", "text": "", "annotations": []}
    at = {"item_id": reply.msg_id, "output_index": 0, "content_index": 0}
    texts: list[str] = []
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
                yield event("response.output_text.delta", delta=ev["text"], logprobs=[], **at)
            elif kind == "done":
                text = "".join(texts)
                final = reply.final(text, ev)
                yield event("response.output_text.done", text=text, logprobs=[], **at)
                yield event("response.content_part.done", part={**part, "text": text}, **at)
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


class _Api:
    input_param = "input"  # what an error about the prompt names as its ``param``


def _event_response(event: dict[str, Any]) -> JSONBody:
    return _openai_event_response(event, _Api())
