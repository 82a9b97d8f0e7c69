"""The templated path end to end, in process: the ``openai`` package over HTTP (chat completions,
completions, Responses with ``previous_response_id``) and the WebSocket protocol (3 turns with
``previous_response_id``), through the front doors' own code and the ``Router``, to a real exact
lane (``Lane`` with fastmode's speculative engine: the full model drafted by the fast one, shipped
weights under a ChatML template). Each turn's prompt ids equal transformers'
``apply_chat_template(..., add_generation_prompt=True, tokenize=True)``; the greedy output equals
transformers' ``generate`` on those ids and stops where the checkpoint's ``generation_config.json``
end-of-turn ids say (``finish_reason`` stop); a forged turn stays text; completions are untemplated.

Not a ``fastmode up`` app (minutes to start): the lanes are in this process, and the other lanes
are recording stand-ins (``test_chat_prompts.py`` covers every lane's ids)."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
import torch
from fastapi import FastAPI, Request, WebSocket
from fastapi.testclient import TestClient
from transformers import AutoTokenizer, LlamaForCausalLM

from models import TEST_FAST, TEST_FULL
from tests.conftest import shipped
from tests.serve.chat_models import CHATML, FORGED, set_end_of_turn, with_template
from tests.serve.test_chat_prompts import Recording

pytestmark = pytest.mark.slow  # a real engine (both shipped models, eager)

QUESTION = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def parse(line):"}]


class Spy:
    """A lane's engine that keeps each ``EngineRequest`` it is given."""

    def __init__(self, engine) -> None:
        self.inner, self.requests = engine, []

    def generate(self, request):
        self.requests.append(request)
        return self.inner.generate(request)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class InProcess:
    """A lane handle (``handle.options(stream=True).generate.remote(request)``) over a ``Lane`` here."""

    def __init__(self, lane) -> None:
        self.lane = lane

    def options(self, stream: bool):
        return self

    @property
    def generate(self):
        return self

    def remote(self, request):
        return _Stream(self.lane.generate(request))


class _Stream:
    def __init__(self, events) -> None:
        self.events = events

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self.events.__anext__()

    def cancel(self) -> None:
        asyncio.ensure_future(self.events.aclose())


def hf_greedy_until_end_of_turn(path, ids: list[int], n: int) -> list[int]:
    """transformers' greedy ``generate``, stopping on the checkpoint's ``generation_config.json`` eos ids."""
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                             pad_token_id=model.config.pad_token_id)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    from serve.config import load_config
    from serve.gateway import api as _  # noqa: F401 - the gateway's imports, as a front door has them
    from serve.lanes.lane import EXACT, Lane
    from serve.openai_api import chat_completions, completions
    from serve.openai_responses import create
    from serve.router import Router
    from serve.websocket import Session

    root = tmp_path_factory.mktemp("chat-app")
    full, fast = shipped(TEST_FULL), shipped(TEST_FAST)
    full = with_template(full, root / "full", CHATML)
    fast = with_template(fast, root / "fast", CHATML)
    # End of turn: <|eos|> and the 4th token transformers' greedy output of QUESTION brings (that the
    # test checkpoint's generation_config.json names it is what the lane must honour, as transformers does).
    ids = AutoTokenizer.from_pretrained(full).apply_chat_template(QUESTION, add_generation_prompt=True,
                                                                  return_dict=False)
    free = hf_greedy_until_end_of_turn(full, ids, 24)
    end = next((t for k, t in enumerate(free) if k >= 3 and t not in free[:k]), free[0])
    set_end_of_turn(full, [1, end])

    config = load_config({"models": {"full": {"id": "chat-full", "path": str(full)},
                                     "fast": {"id": "chat-fast", "path": str(fast)}},
                          "router": {"lane_links": False}, "lanes": {"exact": {"compile": False}}})
    exact = Lane(EXACT, "chat-full", str(full), config.lanes.exact.model_dump(mode="json"), draft_path=str(fast))
    exact.engine = Spy(exact.engine)
    lanes = {name: Lane(name, "chat-full" if name != "fast" else "chat-fast", str(full if name != "fast" else fast),
                        {}, engine=Recording()) for name in ("fast", "priority", "standard")}
    router = Router(config, **{name: InProcess(lane) for name, lane in lanes.items()}, exact=InProcess(exact))

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def _chat(request: Request):
        return await chat_completions(router, request)

    @app.post("/v1/completions")
    async def _completions(request: Request):
        return await completions(router, request)

    @app.post("/v1/responses")
    async def _responses(request: Request):
        return await create(router, request)

    @app.websocket("/v1/responses")
    async def _ws(ws: WebSocket):
        await ws.accept()
        await Session(ws, router, config.gateway).run()

    with TestClient(app) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=http, max_retries=0)
        yield {"client": client, "http": http, "spy": exact.engine, "full": full, "end": end}
    exact.engine.inner.shutdown()


def reference(path, messages) -> list[int]:
    return AutoTokenizer.from_pretrained(path).apply_chat_template(list(messages), add_generation_prompt=True,
                                                                    tokenize=True, return_dict=False)


def test_chat_completions_prompt_output_and_end_of_turn_are_transformers(chat):
    client, spy, full = chat["client"], chat["spy"], chat["full"]
    r = client.chat.completions.create(model="chat-full", service_tier="exact", messages=QUESTION, max_tokens=24,
                                       temperature=0)
    ids = reference(full, QUESTION)
    assert spy.requests[-1].prompt_ids == ids and r.usage.prompt_tokens == len(ids)
    want = hf_greedy_until_end_of_turn(full, ids, 24)
    assert want[-1] == chat["end"] and len(want) < 24  # transformers stopped on the generation config's id
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == len(want)
    # the end-of-turn token's text is not returned, as vLLM's detokenizer (no include_stop_str_in_output)
    assert r.choices[0].message.content == AutoTokenizer.from_pretrained(full).decode(want[:-1], skip_special_tokens=True)
    streamed = client.chat.completions.create(model="chat-full", service_tier="exact", messages=QUESTION,
                                              max_tokens=24, temperature=0, stream=True)
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="chat-full", service_tier="exact", messages=QUESTION, max_tokens=24,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 24 and r.choices[0].finish_reason == "length"


def test_a_forged_turn_is_text_over_http(chat):
    client, spy = chat["client"], chat["spy"]
    client.chat.completions.create(model="chat-full", service_tier="exact", max_tokens=2, temperature=0,
                                   messages=[{"role": "user", "content": FORGED}])
    ids = spy.requests[-1].prompt_ids
    assert (ids.count(0), ids.count(1)) == (2, 1)  # the template's <|bos|> (user turn, generation prompt), <|eos|>


def test_completions_are_not_templated(chat):
    client, spy, full = chat["client"], chat["spy"], chat["full"]
    client.completions.create(model="chat-full", prompt="def parse(line):", max_tokens=2, temperature=0,
                              extra_body={"service_tier": "exact"})
    assert spy.requests[-1].prompt_ids == AutoTokenizer.from_pretrained(full)("def parse(line):").input_ids


def test_responses_turns_with_previous_response_id_are_the_whole_conversations_template(chat):
    client, spy, full = chat["client"], chat["spy"], chat["full"]
    conversation = [{"role": "system", "content": "You write Python."}]
    previous = None
    for turn, question in enumerate(["def parse(line):", "def total(rows):", "def main():"]):
        r = client.responses.create(model="chat-full", service_tier="exact", input=question, max_output_tokens=12,
                                    temperature=0, previous_response_id=previous,
                                    instructions="You write Python." if turn == 0 else None)
        conversation.append({"role": "user", "content": question})
        sent = spy.requests[-1]
        assert sent.prompt_ids == reference(full, conversation)
        assert sent.continues == (turn > 0)
        if turn:  # the exact lane's prefix cache holds the history's keys and values
            assert r.usage.input_tokens_details.cached_tokens > 0
        conversation.append({"role": "assistant", "content": r.output_text})
        previous = r.id


def test_websocket_turns_with_previous_response_id_are_the_whole_conversations_template(chat):
    http, spy, full = chat["http"], chat["spy"], chat["full"]
    conversation: list[dict] = []
    with http.websocket_connect("/v1/responses") as ws:
        for turn, question in enumerate(["hi", "def total(rows):", "thanks"]):
            event = {"type": "response.create", "id": f"t{turn}", "model": "chat-full", "service_tier": "exact",
                     "input": [{"role": "user", "content": question}], "max_output_tokens": 8, "temperature": 0}
            if turn:
                event["previous_response_id"] = f"t{turn - 1}"
            ws.send_text(json.dumps(event))
            text = ""
            while (got := json.loads(ws.receive_text()))["type"] != "response.completed":
                assert got["type"] != "error", got
                text += got.get("delta", "")
            conversation.append({"role": "user", "content": question})
            assert spy.requests[-1].prompt_ids == reference(full, conversation)
            conversation.append({"role": "assistant", "content": text})
