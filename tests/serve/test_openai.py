"""The OpenAI-compatible API (``serve.openai_api``): the official ``openai`` package and vLLM's
benchmark client against a running ``fastmode up``, and the translation layer in process over a
scripted router (request mapping, SSE framing, errors, cancellation)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from models import TEST_FULL
from serve import openai_api
from tests.serve.conftest import REPO, text_of

PROMPT = "def parse(text):\n"
LANES = [("fastmode-fast", None, "fast", "default"),
         ("fastmode-full", "priority", "priority", "priority"), ("fastmode-full", "exact", "exact", "exact"),
         ("fastmode-full", None, "standard", "default")]


def client(a) -> openai.OpenAI:
    return openai.OpenAI(base_url=a.base + "/v1", api_key=a.key, max_retries=0, timeout=120)


# --- against the running application -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("model,tier,lane,service_tier", LANES)
def test_chat_streams_the_same_text_as_whole_responses_and_the_router(app, model, tier, lane, service_tier):
    a = app()
    oai = client(a)
    args = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24,
            "temperature": 0}
    if tier:
        args["service_tier"] = tier
    whole = oai.chat.completions.create(**args)
    chunks = list(oai.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    status, events = a.generate(model=model, service_tier=tier, input=args["messages"], max_output_tokens=24,
                                temperature=0)
    assert status == 200, events
    done = events[-1]

    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert (whole.model, whole.service_tier) == (model, service_tier)
    assert whole.model_extra["fastmode"]["lane"] == lane
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == text_of(events)
    assert choice.finish_reason == done["finish_reason"]
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens) == (
        done["usage"]["input_tokens"], done["usage"]["output_tokens"], done["usage"]["total_tokens"])

    *content, usage = chunks
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert content[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in content[1:])
    assert "".join(c.choices[0].delta.content or "" for c in content) == choice.message.content
    assert [c.choices[0].finish_reason for c in content][-1] == choice.finish_reason
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert {c.service_tier for c in chunks} == {service_tier} and {c.model for c in chunks} == {model}
    assert usage.choices == [] and usage.usage.total_tokens == whole.usage.total_tokens
    # the same prompt again: the lane may reuse the first request's keys and values (the fast lane does)
    cached = [u.prompt_tokens_details.cached_tokens for u in (whole.usage, usage.usage)]
    assert all(0 <= c < whole.usage.prompt_tokens for c in cached), cached
    assert content[-1].model_extra["fastmode"]["cost_units"] > 0


@pytest.mark.slow
def test_text_completions_streamed_and_whole(app):
    a = app()
    oai = client(a)
    args = {"model": "fastmode-full", "prompt": "import os\n", "max_tokens": 16, "temperature": 0}
    whole = oai.completions.create(**args)
    chunks = list(oai.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    status, events = a.generate(model="fastmode-full", input=args["prompt"], max_output_tokens=16,
                                temperature=0)
    assert status == 200, events

    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert whole.choices[0].text == text_of(events)
    assert whole.choices[0].finish_reason == events[-1]["finish_reason"]
    assert whole.usage.completion_tokens == events[-1]["usage"]["output_tokens"]
    assert whole.service_tier == "default"
    *content, usage = chunks
    assert "".join(c.choices[0].text for c in content) == whole.choices[0].text
    assert content[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert usage.choices == [] and usage.usage.total_tokens == whole.usage.total_tokens
    # the same prompt again: the lane may reuse the first request's keys and values (the fast lane does)
    cached = [u.prompt_tokens_details.cached_tokens for u in (whole.usage, usage.usage)]
    assert all(0 <= c < whole.usage.prompt_tokens for c in cached), cached


@pytest.mark.slow
def test_errors_raise_the_openai_packages_typed_exceptions(app):
    oai = client(app())
    chat = {"messages": [{"role": "user", "content": "x = 1\n"}], "max_tokens": 2}
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="gpt-5", **chat)
    assert e.value.code == "unknown_model" and e.value.param == "model" and "fastmode-full" in e.value.message
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="gpt-5", stream=True, **chat)  # refused before the stream starts
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="fastmode-fast", temperature=5, **chat)
    assert e.value.param == "temperature" and "temperature" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="fastmode-fast", n=2, **chat)
    assert e.value.param == "n"
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="fastmode-fast", prompt=[1, 2, 3], max_tokens=2)
    assert e.value.param == "prompt" and "token-id" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="fastmode-fast", prompt="x", max_tokens=100000)
    assert e.value.code == "prompt_too_long"
    served = oai.chat.completions.create(model="fastmode-fast", **chat)  # and the next request is served
    assert served.choices[0].finish_reason in ("stop", "length")


@pytest.mark.slow
def test_overloaded_priority_lane_is_a_rate_limit_error_with_retry_after(app):
    a = app()
    oai = client(a)
    long = {"model": "fastmode-full", "service_tier": "priority", "max_tokens": 480, "temperature": 0,
            "messages": [{"role": "user", "content": "class Parser:\n"}], "extra_body": {"ignore_eos": True}}
    first, second = (oai.chat.completions.create(**long, stream=True) for _ in range(2))
    with first, second:
        assert next(iter(first)).service_tier == next(iter(second)).service_tier == "priority"
        with a.paused("priority"):  # neither can end and give its slot back meanwhile
            with pytest.raises(openai.RateLimitError) as e:
                oai.chat.completions.create(**long)
            assert e.value.code == "overloaded" and int(e.value.response.headers["retry-after"]) >= 1
            spilled = oai.chat.completions.create(**(long | {"max_tokens": 4,
                                                             "extra_body": {"allow_spill": True}}))
        assert spilled.service_tier == "default" and spilled.model_extra["fastmode"]["route"]["spilled_from"]


@pytest.mark.slow
def test_closing_a_stream_frees_its_engine_sequence(app):
    a = app()
    before = a.lane_stats("standard")["cancelled"]
    body = {"model": "fastmode-full", "messages": [{"role": "user", "content": "class Parser:\n"}],
            "max_tokens": 400, "stream": True}
    with a.client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        line = next(x for x in r.iter_lines() if x)
        assert json.loads(line.removeprefix("data: "))["choices"][0]["delta"]["role"] == "assistant"
    deadline = time.monotonic() + 30
    while (stats := a.lane_stats("standard"))["running"] or stats["in_flight"]:
        assert time.monotonic() < deadline, f"the standard lane still holds the sequence: {stats}"
        time.sleep(0.2)
    assert stats["cancelled"] == before + 1


@pytest.mark.slow
@pytest.mark.parametrize("path,budget", [("/v1/chat/completions", "max_tokens"),
                                         ("/v1/responses", "max_output_tokens")])
def test_a_client_that_hangs_up_on_a_whole_response_frees_its_engine_sequence(app, path, budget):
    """A whole (not streamed) response used to run to its end after its client had gone: the handler
    never looked. Now the hang-up cancels the router stream (found while fuzzing: a hostile client
    could keep engines busy for nobody)."""
    import socket

    a = app()
    before = a.lane_stats("standard")["cancelled"]
    body = {"model": "fastmode-full", budget: 480, "temperature": 0, "ignore_eos": True}
    body |= {"messages": [{"role": "user", "content": PROMPT}]} if "chat" in path else {"input": PROMPT}
    payload = json.dumps(body).encode()
    conn = socket.create_connection(("127.0.0.1", a.port))
    conn.sendall(f"POST {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {a.key}\r\nContent-Type: "
                 f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
    deadline = time.monotonic() + 30
    while not ((s := a.lane_stats("standard"))["running"] or s["in_flight"]):  # the lane is generating it
        assert time.monotonic() < deadline, s
        time.sleep(0.01)
    with a.paused("standard") as standard:  # the response cannot end before the hang-up reaches the lane
        conn.close()  # hang up mid-generation, nothing read
        standard.reached_engine()
    deadline = time.monotonic() + 30
    while (s := a.lane_stats("standard"))["running"] or s["in_flight"]:
        assert time.monotonic() < deadline, s
        time.sleep(0.2)
    assert s["cancelled"] == before + 1, s  # cancelled, not finished


@pytest.mark.slow
def test_models_list_and_auto_names_the_model_that_served(app):
    oai = client(app())
    assert {m.id for m in oai.models.list()} == {"fastmode-full", "fastmode-fast", "auto"}
    hard = [{"role": "user", "content": "qZ7#kP!x 9@Lr&vW2^ mB4*tY8 (Jd0%eN6)"}]  # routed to fast (test_router)
    r = oai.chat.completions.create(model="auto", messages=hard, max_tokens=4)
    assert r.model == "fastmode-fast" and r.model_extra["fastmode"]["route"]["by"] == "auto"


def bench(a, *args: str) -> dict:
    """vLLM's benchmark client (``tests/serve/vllm_bench_client.py``) against ``a``: its summary."""
    cmd = [sys.executable, "-m", "tests.serve.vllm_bench_client", "--base-url", a.base,
           "--model", "fastmode-full", "--tokenizer", str(TEST_FULL),
           "--dataset-name", "random", "--random-input-len", "32",
           "--random-output-len", "16", "--num-prompts", "8", "--ignore-eos", "--temperature", "0",
           "--disable-tqdm", "--save-detailed", *args]
    env = os.environ | {"OPENAI_API_KEY": a.key}  # vLLM's client sends it as the bearer key
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    result = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    assert run.returncode == 0 and result, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(result[-1].removeprefix("RESULT "))


@pytest.mark.slow
@pytest.mark.parametrize("backend,endpoint", [("openai-chat", "/v1/chat/completions"),
                                              pytest.param("openai", "/v1/completions", marks=pytest.mark.full)])
def test_vllm_benchmark_client(app, backend, endpoint):
    result = bench(app(), "--backend", backend, "--endpoint", endpoint)
    assert (result["completed"], result["failed"]) == (8, 0), result["errors"]
    assert result["output_lens"] == [16] * 8 and result["total_output_tokens"] == 128  # our usage, ignore_eos
    assert all(result["generated_texts"]) and all(t > 0 for t in result["ttfts"])


# --- in process, over a scripted router ----------------------------------------------------------

CREATED = {"type": "created", "id": "r", "lane": "priority", "model": "fastmode-full", "input_tokens": 3,
           "route": {"by": "model"}}
DELTAS = [{"type": "delta", "id": "r", "seq": 0, "text": "Hel", "tokens": 1},
          {"type": "delta", "id": "r", "seq": 1, "text": "lo", "tokens": 1}]
DONE = {"type": "done", "id": "r", "lane": "priority", "model": "fastmode-full", "finish_reason": "length",
        "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}, "timing": {"ttft_s": 0.1},
        "cost_units": 0.03, "route": {"by": "model"}}
CHAT = {"model": "fastmode-full", "messages": [{"role": "user", "content": "hi"}]}


class ScriptedStream:
    """What ``Router.stream`` returns: the script's events, then the end."""

    def __init__(self, events: list) -> None:
        self.events, self.cancelled = iter(events), False

    def __aiter__(self):
        return self

    async def __anext__(self):
        event = next(self.events, None)
        if event is None:
            raise StopAsyncIteration
        if isinstance(event, Exception):
            raise event
        return event

    def cancel(self) -> None:
        self.cancelled = True


class ScriptedRouter:
    def __init__(self, events: list) -> None:
        self.script, self.bodies, self.streams, self.owners = events, [], [], []

    def stream(self, body: dict, owner: str = "") -> ScriptedStream:
        self.bodies.append(body)
        self.owners.append(owner)
        self.streams.append(ScriptedStream(list(self.script)))
        return self.streams[-1]


def scripted(events: list) -> tuple[ScriptedRouter, TestClient]:
    router, api = ScriptedRouter(events), FastAPI()

    @api.post("/v1/chat/completions")
    async def chat(request: Request):
        return await openai_api.chat_completions(router, request)

    @api.post("/v1/completions")
    async def text(request: Request):
        return await openai_api.completions(router, request)

    return router, TestClient(api)


def sse(r: httpx.Response) -> list:
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("\n\n")
    frames = r.text.split("\n\n")[:-1]
    assert all(f.startswith("data: ") for f in frames), frames
    return [f.removeprefix("data: ") if f == "data: [DONE]" else json.loads(f.removeprefix("data: "))
            for f in frames]


def test_fields_map_onto_the_routers_request():
    router, c = scripted([CREATED, *DELTAS, DONE])
    sampling = {"top_k": 4, "min_p": 0.1, "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -1,
                "logit_bias": {"42": 5}, "stop_token_ids": [7], "min_tokens": 2}
    body = {**CHAT, "max_tokens": 9, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5,
            "stop": ["\n"], **sampling,
            "seed": 3, "service_tier": "priority", "ignore_eos": True, "user": "u",
            "logprobs": False, "n": 1, "response_format": {"type": "text"},
            "messages": [{"role": "system", "content": "a"},
                         {"role": "user", "name": "x",
                          "content": [{"type": "text", "text": "b"}, {"type": "text", "text": "c"}]}]}
    assert c.post("/v1/chat/completions", json=body).status_code == 200
    sent = router.bodies[0]
    assert sent.pop("id").startswith("chatcmpl-")
    assert sent == {"model": "fastmode-full",
                    "input": [{"role": "system", "content": "a"}, {"role": "user", "content": "bc"}],
                    "max_output_tokens": 7, "temperature": 0, "top_p": 0.5, "stop": ["\n"], "seed": 3,
                    "service_tier": "priority", "ignore_eos": True, **sampling}
    text = {"model": "m", "prompt": ["x"], "max_tokens": 4, "logprobs": None}
    assert c.post("/v1/completions", json=text).status_code == 200
    assert router.bodies[1]["input"] == "x" and router.bodies[1]["max_output_tokens"] == 4
    assert all(s.cancelled for s in router.streams)


def test_whole_chat_response_has_openais_shape_and_the_lane():
    _, c = scripted([CREATED, *DELTAS, DONE])
    r = c.post("/v1/chat/completions", json=CHAT).json()
    assert (r["object"], r["model"], r["service_tier"]) == ("chat.completion", "fastmode-full", "priority")
    message = {"role": "assistant", "content": "Hello", "refusal": None}
    assert r["choices"] == [{"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}]
    assert r["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                          "prompt_tokens_details": {"cached_tokens": 0}}
    assert r["fastmode"] == {"lane": "priority", "route": {"by": "model"}, "timing": {"ttft_s": 0.1},
                             "cost_units": 0.03}


def test_chat_stream_frames_role_first_then_usage_and_done():
    router, c = scripted([CREATED, *DELTAS, DONE])
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    *chunks, usage, end = sse(c.post("/v1/chat/completions", json=body))
    assert end == "[DONE]"
    assert [ch["choices"][0]["delta"] for ch in chunks] == [{"role": "assistant", "content": "Hel"},
                                                            {"content": "lo"}, {}]
    assert [ch["choices"][0]["finish_reason"] for ch in chunks] == [None, None, "length"]
    assert all(ch["usage"] is None and ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 5
    assert chunks[-1]["fastmode"]["lane"] == "priority" and router.streams[0].cancelled
    *chunks, end = sse(c.post("/v1/completions", json={"model": "m", "prompt": "x", "stream": True}))
    assert [ch["choices"][0]["text"] for ch in chunks] == ["Hel", "lo", ""] and "usage" not in chunks[0]
    assert chunks[-1]["object"] == "text_completion" and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_an_error_mid_stream_is_the_streams_last_event():
    router, c = scripted([CREATED, DELTAS[0], {"type": "error", "id": "r", "code": "kv_cache_full",
                                               "message": "no room", "status": 503}])
    *chunks, last = sse(c.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    assert chunks[0]["choices"][0]["delta"]["content"] == "Hel"
    assert last == {"error": {"message": "no room", "type": "server_error", "param": None,
                              "code": "kv_cache_full"}}
    r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.json()["error"]["code"] == "kv_cache_full"
    router, c = scripted([CREATED, DELTAS[0], RuntimeError("replica died")])
    *_, last = sse(c.post("/v1/completions", json={"model": "m", "prompt": "x", "stream": True}))
    assert last["error"]["code"] == "internal_error" and "replica died" in last["error"]["message"]
    assert all(s.cancelled for s in router.streams)


def test_refused_requests_are_http_errors_in_openais_shape():
    _, c = scripted([{"type": "error", "id": "r", "code": "overloaded", "message": "full", "status": 429,
                      "retry_after": 0.4}])
    r = c.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert (r.status_code, r.headers["retry-after"]) == (429, "1")
    assert r.json() == {"error": {"message": "full", "type": "rate_limit_error", "param": None,
                                  "code": "overloaded"}}
    _, c = scripted([{"type": "error", "id": "r", "code": "invalid_request", "status": 400,
                      "message": "max_output_tokens: Input should be greater than or equal to 1"}])
    r = c.post("/v1/completions", json={"model": "m", "prompt": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


U = "unsupported_parameter"  # a field this server does not implement
I = "invalid_request"


@pytest.mark.parametrize("path,body,param,code,says", [
    ("chat", {**CHAT, "n": 2}, "n", U, "not supported"),
    ("chat", {**CHAT, "top_logprobs": 2}, "top_logprobs", I, "logprobs: true"),
    ("chat", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs", I, "less than or equal to 20"),
    ("chat", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", U, "not supported"),
    ("chat", {**CHAT, "tool_choice": "required"}, "tool_choice", U, "required"),
    ("chat", {**CHAT, "response_format": {"type": "json_object"}}, "response_format", U, "json_object"),
    ("chat", {**CHAT, "top_k": "five"}, "top_k", I, "integer"),  # vLLM's extension
    ("chat", {**CHAT, "logit_bias": [1]}, "logit_bias", I, "dictionary"),
    ("chat", {**CHAT, "include_stop_str_in_output": True}, "include_stop_str_in_output", U, "not supported"),
    ("chat", {**CHAT, "reasoning_effort": "high"}, "reasoning_effort", U, "not supported"),
    ("chat", {**CHAT, "n": True}, "n", U, "True"),  # JSON's true is not 1
    ("chat", {**CHAT, "colour": "red"}, "colour", U, "unknown parameter"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].type", I, "image_url"),
    ("chat", {**CHAT, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", I, "tool"),
    ("chat", {**CHAT, "messages": []}, "messages", I, "at least 1"),
    ("chat", {**CHAT, "temperature": "hot"}, "temperature", I, "number"),
    ("chat", {**CHAT, "max_tokens": 0}, "max_tokens", I, "greater than or equal to 1"),
    ("chat", {"messages": CHAT["messages"]}, "model", I, "required"),
    ("text", {"model": "m", "prompt": [1, 2]}, "prompt", I, "token-id"),
    ("text", {"model": "m", "prompt": [[1, 2]]}, "prompt", I, "token-id"),
    ("text", {"model": "m", "prompt": ["a", "b"]}, "prompt", I, "one prompt"),
    ("text", {"model": "m", "prompt": "x", "logprobs": -1}, "logprobs", I, "greater than or equal to 0"),
    ("text", {"model": "m", "prompt": "x", "echo": True}, "echo", U, "not supported"),
    ("text", {"model": "m", "prompt": "x", "best_of": 2}, "best_of", U, "not supported"),
    ("text", {"model": "m", "prompt": "x", "suffix": "end"}, "suffix", U, "not supported"),
    ("text", {"model": "m", "prompt": "x", "response_format": {"type": "json_object"}}, "response_format", U, "json"),
    ("text", {"model": "m"}, "prompt", I, "string"),
    # vLLM's SamplingParams fields this server does not implement, on both APIs
    ("chat", {**CHAT, "echo": True}, "echo", U, "not supported"),
    ("chat", {**CHAT, "best_of": 3}, "best_of", U, "not supported"),
    ("text", {"model": "m", "prompt": "x", "n": 2}, "n", U, "not supported"),
    *[(path, {**(CHAT if path == "chat" else {"model": "m", "prompt": "x"}), field: value}, field, U, "unknown parameter")
      for path in ("chat", "text")
      for field, value in (("bad_words", ["x"]), ("allowed_token_ids", [1, 2]), ("prompt_logprobs", 0))],
])
def test_requests_that_cannot_be_honored_get_a_400_naming_the_field(path, body, param, code, says):
    router, c = scripted([CREATED, DONE])
    r = c.post("/v1/chat/completions" if path == "chat" else "/v1/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert error["code"] == code
    assert says in error["message"]
    assert router.bodies == []  # never reached the router


def test_neutral_values_of_unimplemented_fields_and_identifiers_reach_the_router_unchanged():
    """What OpenAI's and LangChain's clients send by default (penalties 0, an empty ``logit_bias``,
    ``n`` 1, ``tool_choice`` none, a ``user``) changes nothing, so it is accepted, not refused; the
    sampling fields among them reach the router as sent."""
    router, c = scripted([CREATED, *DELTAS, DONE])
    body = {**CHAT, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "n": 1, "logprobs": False,
            "tool_choice": "none", "parallel_tool_calls": True, "user": "u-1", "store": False, "top_k": -1,
            "response_format": {"type": "text"}, "seed": 7, "temperature": 0}
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert router.bodies[0]["seed"] == 7 and router.bodies[0]["temperature"] == 0
    assert not {"user", "n", "tool_choice", "logprobs"} & set(router.bodies[0])
    assert (router.bodies[0]["presence_penalty"], router.bodies[0]["logit_bias"], router.bodies[0]["top_k"]) == (0, {}, -1)


OPENAI_FIELDS_SERVED = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
                        "top_p", "stop", "seed", "service_tier", "metadata", "stream_options", "presence_penalty",
                        "frequency_penalty", "logit_bias", "logprobs", "top_logprobs"}


@pytest.mark.parametrize("path", ["chat", "text"])
def test_every_field_of_the_openai_packages_params_is_served_or_refused_by_name(path):
    """Every field of ``openai``'s own ``CompletionCreateParams`` types: a served field reaches the
    router; any other, set to a value that would change the output, is a 400 ``unsupported_parameter``
    naming it (never dropped)."""
    from openai.types import completion_create_params as text_params
    from openai.types.chat import completion_create_params as chat_params

    params = (chat_params if path == "chat" else text_params).CompletionCreateParamsBase.__annotations__
    base = CHAT if path == "chat" else {"model": "m", "prompt": "x"}
    url = "/v1/chat/completions" if path == "chat" else "/v1/completions"
    not_neutral = {"audio": {"voice": "alloy", "format": "wav"},
                   "function_call": "auto", "functions": [{"name": "f"}],
                   "modalities": ["text", "audio"], "moderation": {"x": 1}, "n": 2, "parallel_tool_calls": "yes",
                   "prediction": {"type": "content", "content": "x"}, "prompt_cache_options": {"x": 1},
                   "reasoning_effort": "high", "response_format": {"type": "json_object"}, "store": True,
                   "tool_choice": "required", "tools": [{"type": "function"}], "verbosity": "low",
                   "web_search_options": {}, "best_of": 2, "echo": True, "suffix": "s"}
    no_effect = {"user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention"}
    for field in sorted(params):
        if field in OPENAI_FIELDS_SERVED | no_effect or field in base:
            continue
        assert field in not_neutral, f"{field}: a field of the openai package this test does not know"
        router, c = scripted([CREATED, *DELTAS, DONE])
        r = c.post(url, json={**base, field: not_neutral[field]})
        assert r.status_code == 400, (field, r.text)
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("unsupported_parameter", field), r.text
        assert router.bodies == []
    for field in sorted(no_effect & set(params)):
        router, c = scripted([CREATED, *DELTAS, DONE])
        assert c.post(url, json={**base, field: "x"}).status_code == 200, field
    sampled = {"temperature": 0.5, "top_p": 0.5, "stop": ["x"], "seed": 1, "presence_penalty": 1,
               "frequency_penalty": -1, "logit_bias": {"1": 1}}
    for field in sorted(OPENAI_FIELDS_SERVED & set(params) & set(sampled)):  # reaches the router as sent
        router, c = scripted([CREATED, *DELTAS, DONE])
        assert c.post(url, json={**base, field: sampled[field]}).status_code == 200, field
        assert router.bodies[0][field] == sampled[field], field


LOGPROBS = [{"token": "Hel", "id": 5, "logprob": -0.5, "top_logprobs": [{"token": "Hel", "id": 5, "logprob": -0.5},
                                                                       {"token": "Hi", "id": 6, "logprob": -1.5}]},
            {"token": "lo", "id": 7, "logprob": float("-inf"), "top_logprobs": [{"token": "l", "id": 8, "logprob": -0.1},
                                                                                {"token": "o", "id": 9, "logprob": -2}]}]


def test_logprobs_are_openais_shapes_whole_and_streamed():
    """The deltas' entries as OpenAI's (and vLLM's) objects: chat's ``logprobs.content`` with ``bytes`` and
    ``top_logprobs``; completions' ``tokens``/``token_logprobs``/``top_logprobs``/``text_offset`` (the
    sampled token's entry first in each map); -inf as -9999."""
    deltas = [{**DELTAS[0], "logprobs": LOGPROBS[:1]}, {**DELTAS[1], "logprobs": LOGPROBS[1:]}]
    router, c = scripted([CREATED, *deltas, DONE])
    r = c.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 2}).json()
    assert router.bodies[0]["logprobs"] == 2
    content = r["choices"][0]["logprobs"]["content"]
    assert content[0] == {"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108],
                          "top_logprobs": [{"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108]},
                                           {"token": "Hi", "logprob": -1.5, "bytes": [72, 105]}]}
    assert content[1]["logprob"] == -9999.0 and len(content) == 2
    router, c = scripted([CREATED, *deltas, DONE])
    *chunks, end = sse(c.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "stream": True}))
    assert router.bodies[0]["logprobs"] == 0
    assert [len(ch["choices"][0]["logprobs"]["content"]) for ch in chunks[:2]] == [1, 1]
    assert chunks[2]["choices"][0]["logprobs"] is None
    router, c = scripted([CREATED, *deltas, DONE])
    r = c.post("/v1/completions", json={"model": "m", "prompt": "x", "logprobs": 1}).json()
    assert r["choices"][0]["logprobs"] == {"tokens": ["Hel", "lo"], "token_logprobs": [-0.5, -9999.0],
                                           "top_logprobs": [{"Hel": -0.5, "Hi": -1.5}, {"lo": -9999.0, "l": -0.1, "o": -2}],
                                           "text_offset": [0, 3]}
    router, c = scripted([CREATED, *deltas, DONE])
    *chunks, end = sse(c.post("/v1/completions", json={"model": "m", "prompt": "x", "logprobs": 1, "stream": True}))
    assert [ch["choices"][0]["logprobs"]["text_offset"] for ch in chunks[:2]] == [[0], [3]]
    router, c = scripted([CREATED, *DELTAS, DONE])  # not asked: none
    assert c.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["logprobs"] is None
    assert "logprobs" not in router.bodies[0]


def test_a_body_that_is_not_json_is_a_400():
    _, c = scripted([CREATED, DONE])
    for content in (b"{nope", b"[1]", b"[" * 100_000 + b"]" * 100_000, b"1" * 5000, b"\xff\xfe"):
        r = c.post("/v1/chat/completions", content=content)  # too deep for json.loads: a 500, found by the fuzz
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_an_error_that_echoes_a_lone_surrogate_is_still_a_json_400():
    """An error message may echo a request's text, which JSON lets hold a lone surrogate; Starlette's
    UTF-8 body cannot encode one (a 500). Bodies are written as ASCII, as SSE and WebSocket events are."""
    message = "metadata.\ud800: Input should be a valid string"
    _, c = scripted([{"type": "error", "id": "r", "code": "invalid_request", "message": message, "status": 400}])
    r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 400 and r.json()["error"]["message"] == message
    assert r.content.isascii()


def test_a_client_that_hangs_up_while_a_write_waits_ends_the_stream_at_once():
    """A client that stopped reading and then hung up: the write waiting for it is what gets cancelled,
    so the body generator stays suspended at its ``yield`` and its ``finally`` waits for the garbage
    collector (Starlette's own ``StreamingResponse``, under uvicorn's ASGI 2.3). ``ClosingStream``,
    which the NDJSON and SSE routes return, calls ``on_close`` (the router stream's ``cancel``) as it
    ends."""
    from starlette.responses import StreamingResponse

    from serve.openai_api import ClosingStream

    async def serve(make) -> list[str]:
        log: list[str] = []

        async def body():
            try:
                yield "created\n"
                yield "delta\n"
                await asyncio.sleep(3600)
            finally:
                log.append("body's finally")

        writing = asyncio.Event()

        async def send(message):
            if message["type"] == "http.response.body":
                writing.set()
                await asyncio.sleep(3600)  # the client reads no more: the write waits

        async def receive():
            await writing.wait()
            return {"type": "http.disconnect"}  # then it hangs up

        response = make(body(), log)
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "method": "POST", "headers": []}
        await asyncio.wait_for(response(scope, receive, send), 5)
        return list(log)  # as the response ends (asyncio.run finalizes the generator afterwards)

    plain = asyncio.run(serve(lambda b, log: StreamingResponse(b, media_type="application/x-ndjson")))
    assert plain == []  # the generator is suspended, not closed: nothing freed the engine yet
    closing = asyncio.run(serve(lambda b, log: ClosingStream(b, on_close=lambda: log.append("on_close"),
                                                     media_type="application/x-ndjson")))
    assert closing == ["on_close"]
