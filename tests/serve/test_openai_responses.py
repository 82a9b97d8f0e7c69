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
from tests.serve.test_openai import CREATED, DELTAS, DONE, LOGPROBS, ScriptedRouter, client

LP = "message.output_text.logprobs"

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
            "max_output_tokens": 9, "temperature": 0, "top_p": 0.5, "service_tier": "priority",
            "chat_template_kwargs": {"enable_thinking": False}}
    assert c.post("/v1/responses", json=body).status_code == 200
    sent = router.bodies[0]
    assert sent["chat_template_kwargs"] == {"enable_thinking": False} and "logprobs" not in sent
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
    ({"model": "m", "input": "x", "top_logprobs": 2}, "top_logprobs", "invalid_request"),  # without include
    ({"model": "m", "input": "x", "top_logprobs": 21, "include": [LP]}, "top_logprobs", "invalid_request"),
    ({"model": "m", "input": "x", "include": ["reasoning.encrypted_content"]}, "include", "unsupported_parameter"),
    ({"model": "m", "input": "x", "include": [LP, "message.input_image.image_url"]}, "include",
     "unsupported_parameter"),
    ({"model": "m", "input": "x", "chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs",
     "invalid_request"),
    ({"model": "m", "input": "x", "background": True}, "background", "unsupported_parameter"),
    ({"model": "m", "input": "x", "colour": "red"}, "colour", "unsupported_parameter"),
    *[({"model": "m", "input": "x", field: value}, field, "unsupported_parameter")
      for field, value in (("n", 2), ("best_of", 2), ("echo", True), ("bad_words", ["x"]),
                           ("allowed_token_ids", [1]), ("prompt_logprobs", 0))],
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


def test_logprobs_with_include_are_openais_shapes_whole_and_streamed():
    """``include: ["message.output_text.logprobs"]`` with ``top_logprobs`` asks the router for ``logprobs``
    (vLLM's reading); the answer has the ``openai`` package's own shapes (validated by its types):
    ``output_text.logprobs`` with ``bytes``, each delta's ``logprobs`` without (as vLLM's stream)."""
    from openai.types.responses import ResponseOutputText, ResponseTextDeltaEvent, ResponseTextDoneEvent

    deltas = [{**DELTAS[0], "logprobs": LOGPROBS[:1]}, {**DELTAS[1], "logprobs": LOGPROBS[1:]}]
    router, c = scripted([CREATED, *deltas, STOPPED])
    body = {"model": "fastmode-full", "input": "hi", "include": [LP], "top_logprobs": 2}
    r = c.post("/v1/responses", json=body).json()
    assert router.bodies[0]["logprobs"] == 2 and "include" not in router.bodies[0]
    assert r["top_logprobs"] == 2
    (part,) = [ResponseOutputText.model_validate(p) for p in r["output"][0]["content"]]
    assert [(lp.token, lp.logprob, lp.bytes) for lp in part.logprobs] == [("Hel", -0.5, [72, 101, 108]),
                                                                         ("lo", -9999.0, [108, 111])]
    assert [(t.token, t.logprob, t.bytes) for t in part.logprobs[0].top_logprobs] == [
        ("Hel", -0.5, [72, 101, 108]), ("Hi", -1.5, [72, 105])]

    router, c = scripted([CREATED, *deltas, STOPPED])
    events = [json.loads(f.split("\n", 1)[1].removeprefix("data: "))
              for f in c.post("/v1/responses", json={**body, "stream": True, "top_logprobs": None}).text.split("\n\n") if f]
    assert router.bodies[0]["logprobs"] == 0  # include alone: the sampled tokens' own
    got = [ResponseTextDeltaEvent.model_validate(e) for e in events if e["type"] == "response.output_text.delta"]
    assert [[(lp.token, lp.logprob) for lp in d.logprobs] for d in got] == [[("Hel", -0.5)], [("lo", -9999.0)]]
    assert [(t.token, t.logprob) for t in got[1].logprobs[0].top_logprobs] == [("l", -0.1), ("o", -2)]
    done = ResponseTextDoneEvent.model_validate(next(e for e in events if e["type"] == "response.output_text.done"))
    assert [lp.token for lp in done.logprobs] == ["Hel", "lo"]
    final = ResponseOutputText.model_validate(events[-1]["response"]["output"][0]["content"][0])
    assert [lp.token for lp in final.logprobs] == ["Hel", "lo"]
    part_done = next(e for e in events if e["type"] == "response.content_part.done")["part"]
    assert ResponseOutputText.model_validate(part_done) == final

    router, c = scripted([CREATED, *DELTAS, STOPPED])  # not asked: none, and no logprobs in the part
    r = c.post("/v1/responses", json={"model": "fastmode-full", "input": "hi", "top_logprobs": 0}).json()
    assert "logprobs" not in router.bodies[0] and "logprobs" not in r["output"][0]["content"][0]


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


RESPONSES_SERVED = {"model", "input", "instructions", "previous_response_id", "store", "max_output_tokens",
                    "temperature", "top_p", "service_tier", "metadata", "top_logprobs", "include"}
"""Fields of ``responses.create`` this server implements (reaching the router)."""


def test_every_field_of_the_openai_packages_responses_params_is_served_or_refused_by_name():
    """Every field of ``openai``'s own ``ResponseCreateParamsBase``: a served one reaches the router; any
    other, set to a value that would change the output, is a 400 naming it (never dropped)."""
    from openai.types.responses import response_create_params

    params = response_create_params.ResponseCreateParamsBase.__annotations__
    base = {"model": "m", "input": "x"}
    not_neutral = {"background": True, "background_options": {"x": 1}, "context_management": [{"type": "x"}],
                   "conversation": "conv_1", "image": {"x": 1}, "max_tool_calls": 2, "moderation": {"x": 1},
                   "prompt": {"id": "pmpt_1"}, "prompt_cache_options": {"x": 1},
                   "reasoning": {"effort": "high"}, "text": {"format": {"type": "json_object"}},
                   "tool_choice": "required", "tools": [{"type": "web_search"}], "truncation": "auto",
                   "access_programs": ["x"], "stream_options": {"include_obfuscation": True}}
    # identifiers and options of what is not served (no tools: parallel tool calls change nothing)
    no_effect = {"user": "u", "safety_identifier": "s", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
                 "parallel_tool_calls": True}
    for field in sorted(params):
        if field in RESPONSES_SERVED | set(no_effect):
            continue
        assert field in not_neutral, f"{field}: a field of the openai package this test does not know"
        router, c = scripted([CREATED, *DELTAS, DONE])
        r = c.post("/v1/responses", json={**base, field: not_neutral[field]})
        assert r.status_code == 400, (field, r.text)
        assert r.json()["error"]["param"] == field, (field, r.json())
        assert r.json()["error"]["code"] in ("unsupported_parameter", "invalid_request"), (field, r.json())
        assert router.bodies == []
    for field in sorted(set(no_effect) & set(params)):
        router, c = scripted([CREATED, *DELTAS, DONE])
        r = c.post("/v1/responses", json={**base, field: no_effect[field]})
        assert r.status_code == 200, (field, r.text)
    sent = {"instructions": "be brief", "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.5,
            "service_tier": "priority", "metadata": {"k": "v"}}
    for field, value in sent.items():  # reaches the router
        router, c = scripted([CREATED, *DELTAS, DONE])
        assert c.post("/v1/responses", json={**base, field: value}).status_code == 200, field
        assert router.bodies, field
