"""OpenAI's Responses API over HTTP (``POST /v1/responses``, ``serve.openai_responses``): the
official ``openai`` package against the running app (multi-turn with ``previous_response_id``,
streamed and whole), and the translation layer in process over a scripted router."""

from __future__ import annotations

import json

import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from serve import openai_responses
from tests.serve.conftest import text_of
from tests.serve.test_openai import CREATED, DELTAS, DONE, ScriptedRouter, client

STOPPED = {**DONE, "finish_reason": "stop", "usage": {**DONE["usage"], "input_tokens_details": {"cached_tokens": 2}}}


def scripted(events: list) -> tuple[ScriptedRouter, TestClient]:
    router, api = ScriptedRouter(events), FastAPI()

    @api.post("/v1/responses")
    async def create(request: Request):
        return await openai_responses.create(router, request)

    return router, TestClient(api)


def test_fields_map_onto_the_routers_request():
    router, c = scripted([CREATED, *DELTAS, DONE])
    body = {"model": "fastmode-full", "instructions": "be brief", "previous_response_id": "resp_1",
            "input": [{"role": "user", "content": "a"},
                      {"role": "assistant", "content": [{"type": "output_text", "text": "b", "annotations": []}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "c"},
                                                                       {"type": "input_text", "text": "d"}]}],
            "max_output_tokens": 9, "temperature": 0, "top_p": 0.5, "service_tier": "priority"}
    assert c.post("/v1/responses", json=body).status_code == 200
    sent = router.bodies[0]
    assert sent["input"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a"},
                             {"role": "assistant", "content": "b"}, {"role": "user", "content": "cd"}]
    assert (sent["previous_response_id"], sent["store"], sent["max_output_tokens"], sent["temperature"],
            sent["top_p"], sent["service_tier"]) == ("resp_1", True, 9, 0, 0.5, "priority")
    assert sent["id"].startswith("resp_")
    c.post("/v1/responses", json={"model": "m", "input": "x", "store": False})
    assert router.bodies[1]["input"] == [{"role": "user", "content": "x"}] and router.bodies[1]["store"] is False


def test_a_whole_response_has_openais_shape():
    _, c = scripted([CREATED, *DELTAS, DONE])
    r = c.post("/v1/responses", json={"model": "fastmode-full", "input": "hi"}).json()
    assert r["object"] == "response" and r["id"].startswith("resp_") and r["model"] == "fastmode-full"
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}  # length
    (item,) = r["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["content"] == [{"type": "output_text", "text": "Hello", "annotations": []}]
    assert r["usage"] == {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 2,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 5}
    assert r["service_tier"] == "priority" and r["fastmode"]["lane"] == "priority" and r["store"] is True
    _, c = scripted([CREATED, *DELTAS, STOPPED])
    r = c.post("/v1/responses", json={"model": "fastmode-full", "input": "hi"}).json()
    assert r["status"] == "completed" and r["incomplete_details"] is None
    assert r["usage"]["input_tokens_details"] == {"cached_tokens": 2}


def test_the_stream_is_openais_event_sequence():
    router, c = scripted([CREATED, *DELTAS, STOPPED])
    r = c.post("/v1/responses", json={"model": "fastmode-full", "input": "hi", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in r.text.split("\n\n") if f]
    events = []
    for f in frames:
        kind, data = f.split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hello"
    assert events[0]["response"]["status"] == "in_progress" and router.streams[0].cancelled


@pytest.mark.parametrize("body, param, code", [
    ({"model": "m"}, "input", "invalid_request"),
    ({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "tools", "invalid_request"),
    ({"model": "m", "input": "x", "temperature": 3}, "temperature", "invalid_request"),
    ({"model": "m", "input": "x", "reasoning": {"effort": "low"}}, "reasoning", "unsupported_parameter"),
    ({"model": "m", "input": "x", "top_logprobs": 2}, "top_logprobs", "unsupported_parameter"),
    ({"model": "m", "input": "x", "include": ["message.output_text.logprobs"]}, "include", "unsupported_parameter"),
    ({"model": "m", "input": "x", "background": True}, "background", "unsupported_parameter"),
    ({"model": "m", "input": "x", "colour": "red"}, "colour", "unsupported_parameter"),
])
def test_bad_bodies_get_openais_error_naming_the_field(body, param, code):
    router, c = scripted([CREATED, *DELTAS, DONE])
    r = c.post("/v1/responses", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.json()
    assert r.json()["error"]["type"] == "invalid_request_error" and router.bodies == []
    assert r.json()["error"]["code"] == code


def test_seed_and_neutral_fields_reach_the_router():
    router, c = scripted([CREATED, *DELTAS, DONE])
    r = c.post("/v1/responses", json={"model": "m", "input": "x", "seed": 3, "top_logprobs": 0, "include": [],
                                      "background": False, "text": {"format": {"type": "text"}}})
    assert r.status_code == 200, r.text
    assert router.bodies[0]["seed"] == 3 and "include" not in router.bodies[0]


def test_a_response_that_echoes_a_lone_surrogate_is_still_written():
    """JSON carries lone surrogates as escapes; the response object echoes ``metadata``, and Starlette's
    UTF-8 body could not encode one (a 500 after the whole generation). The router refuses them now
    (``invalid_request``), and bodies are written as ASCII, as the SSE and WebSocket events are."""
    _, c = scripted([CREATED, *DELTAS, DONE])  # a scripted router: it refuses nothing
    r = c.post("/v1/responses", content=b'{"model": "m", "input": "x", "metadata": {"k": "\\ud800"}}')
    assert r.status_code == 200 and r.json()["metadata"] == {"k": "\ud800"} and r.content.isascii()


def test_a_refusal_is_a_plain_http_error():
    refused = {"type": "error", "id": "r", "code": "previous_response_not_found", "message": "gone", "status": 400}
    _, c = scripted([refused])
    r = c.post("/v1/responses", json={"model": "m", "input": "x", "previous_response_id": "resp_x"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"


# --- against the running application, with the official client -----------------------------------


@pytest.mark.slow
def test_the_openai_client_runs_a_conversation(app):
    a = app()
    oai = client(a)
    params = {"model": "fastmode-fast", "max_output_tokens": 8, "temperature": 0}
    first = oai.responses.create(input="def parse(line):", **params)
    second = oai.responses.create(input="def total(rows):", previous_response_id=first.id, **params)
    assert first.status == second.status == "incomplete" and second.previous_response_id == first.id
    conversation = [{"role": "user", "content": "def parse(line):"},
                    {"role": "assistant", "content": first.output_text},
                    {"role": "user", "content": "def total(rows):"}]
    _, ref = a.generate(model="fastmode-fast", input=conversation, max_output_tokens=8, temperature=0)
    assert second.output_text == text_of(ref) and second.usage.input_tokens == ref[-1]["usage"]["input_tokens"]
    assert second.usage.input_tokens_details.cached_tokens > 0  # the fast lane kept the first turn's slot

    events = list(oai.responses.create(input="def total(rows):", previous_response_id=first.id, stream=True,
                                       **params))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == second.output_text
    assert events[-1].response.output_text == second.output_text

    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(input="x", previous_response_id="resp_missing", **params)
    assert e.value.code == "previous_response_not_found"
