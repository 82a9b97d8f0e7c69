"""Chat templates from each front door's request to the ids each lane's engine receives, in process:
the lanes (``Lane`` around a recording engine) and the fast lane's door get transformers'
``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`` for chat input, and
stop on the checkpoint's end-of-turn ids; a text input is not templated; the shipped models (no
template) keep the join. The whole path with a real engine, over the ``openai`` package, is
``test_chat_app.py``."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from models import TEST_FAST, TEST_FULL
from serve.chat import end_of_turn_ids
from serve.lanes.engine import EngineOutput
from serve.lanes.lane import LANES, Lane
from serve.request import ChatPrompt, GenerateRequest, join_messages
from tests.serve.chat_models import CHATML, FORGED, with_template

EOT = [1, 7]
"""The test checkpoints' ``generation_config.json`` end-of-turn ids: the tokenizer's ``<|eos|>`` and one more."""

CONVERSATIONS = [
    [{"role": "user", "content": "Write a parser."}],
    [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def parse(line):"},
     {"role": "assistant", "content": "\n    return line.split()"}, {"role": "user", "content": "and total(rows)?"}],
    [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "caf\u00e9 \u2713 \t x"}],
]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    return with_template(TEST_FULL, tmp_path_factory.mktemp("chat") / "full", CHATML, EOT)


def reference(path, messages) -> list[int]:
    return AutoTokenizer.from_pretrained(path).apply_chat_template(messages, add_generation_prompt=True,
                                                                    tokenize=True, return_dict=False)


class Recording:
    """A lane engine that keeps each request and ends it at once."""

    max_len = 512

    def __init__(self) -> None:
        self.requests = []

    async def generate(self, request):
        self.requests.append(request)
        yield EngineOutput([1], "", "stop")

    def failure(self):
        return None

    def num_unfinished(self) -> int:
        return 0


def run(lane: Lane, body: dict) -> list[dict]:
    request = GenerateRequest.parse({"model": "m", **body}).to_lane(f"r{len(lane.engine.requests)}")

    async def go():
        return [e async for e in lane.generate(request)]

    return asyncio.run(go())


@pytest.mark.parametrize("name", LANES)
def test_every_lane_gets_the_templates_ids_and_stops_at_end_of_turn(full, name):
    engine = Recording()
    lane = Lane(name, "m", str(full), {}, engine=engine)
    for messages in CONVERSATIONS:
        events = run(lane, {"input": messages})
        sent = engine.requests[-1]
        assert sent.prompt_ids == reference(full, messages)
        assert events[0] == {"type": "accepted", "input_tokens": len(sent.prompt_ids)}
        assert sent.stop_token_ids == tuple(EOT) and sent.sampling().stop_token_ids == tuple(EOT)
    run(lane, {"input": CONVERSATIONS[0], "ignore_eos": True})
    assert engine.requests[-1].stop_token_ids == () and engine.requests[-1].ignore_eos
    run(lane, {"input": "def parse(line):"})  # a text: no template
    assert engine.requests[-1].prompt_ids == Tokenizer.from_file(str(full / "tokenizer.json")).encode(
        "def parse(line):").ids


def test_a_conversations_next_turn_continues_on_the_lane(full):
    engine = Recording()
    lane = Lane("standard", "m", str(full), {}, engine=engine)
    history = [{"role": "user", "content": "hi"}]
    for turn in range(3):
        run(lane, {"input": history})
        sent = engine.requests[-1]
        assert sent.prompt_ids == reference(full, history) and sent.continues == (turn > 0)
        history = history + [{"role": "assistant", "content": f"answer {turn}"}, {"role": "user", "content": "more"}]


def test_a_forged_turn_in_a_message_is_text_on_the_lane(full):
    engine = Recording()
    lane = Lane("exact", "m", str(full), {}, engine=engine)
    run(lane, {"input": [{"role": "user", "content": FORGED}]})
    ids = engine.requests[-1].prompt_ids
    honest = reference(full, [{"role": "user", "content": "hi"}])
    assert (ids.count(0), ids.count(1)) == (honest.count(0), honest.count(1)) == (2, 1)  # <|bos|> x2, <|eos|>
    assert AutoTokenizer.from_pretrained(full).decode(ids) == AutoTokenizer.from_pretrained(full).apply_chat_template(
        [{"role": "user", "content": FORGED}], add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("path", [TEST_FULL, TEST_FAST], ids=["full", "fast"])
def test_a_model_without_a_template_keeps_the_join(path):
    engine = Recording()
    lane = Lane("fast" if path == TEST_FAST else "priority", "m", str(path), {}, engine=engine)
    for messages in CONVERSATIONS:
        run(lane, {"input": messages})
        text = join_messages((m["role"], m["content"]) for m in messages)
        assert engine.requests[-1].prompt_ids == Tokenizer.from_file(str(path / "tokenizer.json")).encode(text).ids
        assert engine.requests[-1].stop_token_ids == (1,)  # the shipped eos, which the engines stopped on already
    with pytest.raises(Exception, match="chat_template_kwargs: the model has no chat template"):
        run(lane, {"input": CONVERSATIONS[0], "chat_template_kwargs": {"x": 1}})


def test_the_configs_template_reaches_the_lane(tmp_path):
    engine = Recording()
    lane = Lane("fast", "m", str(TEST_FAST), {}, engine=engine, chat_template=CHATML)
    run(lane, {"input": CONVERSATIONS[1]})
    hf = AutoTokenizer.from_pretrained(TEST_FAST)
    assert engine.requests[-1].prompt_ids == hf.apply_chat_template(
        CONVERSATIONS[1], chat_template=CHATML, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_the_door_gets_the_same_ids_and_stops(tmp_path):
    from serve.lanes.door import Door, DoorConnection, DoorSpec
    from sharding.config import ModelConfig

    fast = with_template(TEST_FAST, tmp_path / "fast", CHATML, EOT)
    door = Door(DoorSpec(model_id="m", model_path=str(fast), price=1.0, host="127.0.0.1"),
                ModelConfig.from_pretrained(fast), 512)
    a, b = socket.socketpair()
    try:
        conn = DoorConnection(door, a, 0)
        for i, messages in enumerate(CONVERSATIONS):
            body = {"model": "m", "input": messages}
            kind, rid, ids, params = conn._create(f"r{i}", body, json.dumps(body).encode())
            assert (kind, ids) == ("add", reference(fast, messages))
            assert params.stop_token_ids == tuple(EOT)
        kind, rid, ids, params = conn._create("f", {"model": "m", "input": [{"role": "user", "content": FORGED}]}, b"{}")
        assert (ids.count(0), ids.count(1)) == (2, 1)  # the template's own <|bos|> x2 and <|eos|> only
        kind, rid, ids, params = conn._create("t", {"model": "m", "input": "x = 1", "ignore_eos": True}, b"{}")
        assert ids == Tokenizer.from_file(str(fast / "tokenizer.json")).encode("x = 1").ids
        assert params.stop_token_ids == ()
    finally:
        door.close()
        b.close()


def test_end_of_turn_ids_are_the_configs_the_generation_configs_and_the_tokenizers(tmp_path):
    assert end_of_turn_ids(TEST_FULL) == (1,)
    path = with_template(TEST_FULL, tmp_path / "m", None, [7, 1, 9])
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|pad|>"  # id 2
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    assert end_of_turn_ids(path) == (1, 7, 9, 2)


def test_every_front_door_hands_the_lane_the_conversation():
    """Chat completions, Responses (``instructions`` first, a string ``input`` one user message),
    gRPC's messages and the WebSocket's ``response.create`` all reach the lane as one ``ChatPrompt``;
    completions' prompt and gRPC's text stay a text."""
    from serve.openai_responses import ResponsesRequest
    from serve.openai_schema import ChatCompletionRequest, CompletionRequest, OpenAIRequestError, parse
    from serve.rpc import inference_pb2 as pb
    from serve.rpc.server import to_request

    want = ChatPrompt((("system", "s"), ("user", "u")))

    def prompt(body: dict):
        return GenerateRequest.parse(body).prompt

    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    chat = parse(ChatCompletionRequest, {"model": "m", "messages": messages,
                                         "chat_template_kwargs": {"enable_thinking": False}})
    assert prompt(chat.generate_request("c")) == ChatPrompt(want.messages, {"enable_thinking": False})
    assert prompt(ResponsesRequest(model="m", input="u", instructions="s").generate_request("r")) == want
    assert prompt({"model": "m", "input": messages}) == want
    grpc = pb.GenerateRequest(model="m", messages=pb.Messages(messages=[pb.Message(role=m["role"], content=m["content"])
                                                                          for m in messages]))
    assert prompt(to_request(grpc, {})) == want
    assert prompt(to_request(pb.GenerateRequest(model="m", text="x"), {})) == "x"
    assert prompt(parse(CompletionRequest, {"model": "m", "prompt": "x"}).generate_request("t")) == "x"
    with pytest.raises(OpenAIRequestError) as e:  # completions are never templated
        parse(CompletionRequest, {"model": "m", "prompt": "x", "chat_template_kwargs": {}})
    assert (e.value.code, e.value.param) == ("unsupported_parameter", "chat_template_kwargs")


def test_chat_template_kwargs_from_every_front_door_render_on_the_lane(tmp_path):
    """``chat_template_kwargs`` on chat completions, Responses over HTTP, the WebSocket and gRPC (a
    ``Struct``) reach the lane, whose ids are transformers' ``apply_chat_template(..., **kwargs)``: with
    a Qwen3-style template, ``enable_thinking: false`` appends an empty thinking block."""
    from serve.openai_responses import ResponsesRequest
    from serve.openai_schema import ChatCompletionRequest, parse
    from serve.rpc import inference_pb2 as pb
    from serve.rpc.server import to_request
    from tests.serve.chat_models import THINKING

    path = with_template(TEST_FAST, tmp_path / "thinking", THINKING)
    engine = Recording()
    lane = Lane("fast", "m", str(path), {}, engine=engine)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    off = {"enable_thinking": False}
    want = AutoTokenizer.from_pretrained(path).apply_chat_template(messages, add_generation_prompt=True,
                                                                   tokenize=True, return_dict=False, **off)
    assert want != reference(path, messages)  # the variable changes the prompt
    grpc = pb.GenerateRequest(model="m", messages=pb.Messages(messages=[pb.Message(**m) for m in messages]),
                              chat_template_kwargs=off)
    bodies = {"chat": parse(ChatCompletionRequest, {"model": "m", "messages": messages,
                                                    "chat_template_kwargs": off}).generate_request("c"),
              "responses": ResponsesRequest(model="m", input="u", instructions="s",
                                            chat_template_kwargs=off).generate_request("r"),
              "websocket": {"model": "m", "input": messages, "chat_template_kwargs": off},
              "grpc": to_request(grpc, {})}
    for door, body in bodies.items():
        run(lane, {k: v for k, v in body.items() if k not in ("id", "store")})
        assert engine.requests[-1].prompt_ids == want, door
    run(lane, {"input": messages})
    assert engine.requests[-1].prompt_ids == reference(path, messages)


def test_the_configs_chat_template_is_a_template_or_a_file(tmp_path):
    from serve.config import load_config
    from serve.errors import ConfigError

    (tmp_path / "chatml.jinja").write_text(CHATML)
    config = tmp_path / "app.yaml"
    config.write_text(f"models:\n  full: {{id: f, path: {TEST_FULL}, chat_template: chatml.jinja,"
                      " chat_template_kwargs: {enable_thinking: false}}\n"
                      f"  fast: {{id: s, path: {TEST_FAST}, chat_template: \"{{{{ messages }}}}\"}}\n")
    models = load_config(config).models
    assert (models.full.chat_template, models.full.chat_template_kwargs) == (CHATML, {"enable_thinking": False})
    assert models.fast.chat_template == "{{ messages }}"
    config.write_text(f"models:\n  full: {{id: f, path: {TEST_FULL}, chat_template: missing.jinja}}\n")
    with pytest.raises(ConfigError, match="models.full.chat_template: no template file"):
        load_config(config)


def test_the_vllm_lanes_hand_vllm_the_ids_and_the_end_of_turn_ids():
    """What ``VLLMLaneEngine`` gives vLLM's ``AsyncLLM.generate`` (a stand-in here; the lanes against
    vLLM itself: ``test_lanes.py``): the lane's prompt ids as a ``TokensPrompt``, the end-of-turn ids
    as ``stop_token_ids``."""
    from types import SimpleNamespace

    from serve.lanes.engine import EngineRequest
    from serve.lanes.vllm_engine import VLLMLaneEngine

    calls = []

    class AsyncLLM:
        errored = False

        async def generate(self, prompt, params, request_id):
            calls.append((prompt, params))
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7], text="", finish_reason="stop")],
                                  finished=True, metrics=None, num_cached_tokens=0)

        def get_num_unfinished_requests(self) -> int:
            return 0

    engine = VLLMLaneEngine.__new__(VLLMLaneEngine)
    engine.engine, engine.sessions = AsyncLLM(), None

    async def go(request):
        return [o async for o in engine.generate(request)]

    asyncio.run(go(EngineRequest("r", [0, 5, 6], 4, temperature=0, stop_token_ids=tuple(EOT))))
    prompt, params = calls[-1]
    assert prompt["prompt_token_ids"] == [0, 5, 6] and params.stop_token_ids == EOT and not params.ignore_eos
    asyncio.run(go(EngineRequest("r", [0, 5], 4, temperature=0, ignore_eos=True)))
    assert calls[-1][1].stop_token_ids == [] and calls[-1][1].ignore_eos
