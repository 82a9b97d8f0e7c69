"""Request validation: each bad field gets ``invalid_request`` naming it."""

from __future__ import annotations

import pytest

from serve.errors import InvalidRequest
from serve.request import ChatPrompt, GenerateRequest


def test_defaults_and_prompt_forms():
    r = GenerateRequest.parse({"model": "m", "input": "abc"})
    assert (r.temperature, r.top_p, r.max_output_tokens, r.stop_list, r.allow_spill) == (1.0, 1.0, None, [], False)
    assert r.prompt == "abc"  # a text: no template touches it
    chat = GenerateRequest.parse({"model": "m", "input": [{"role": "system", "content": "a"},
                                                          {"role": "user", "content": "b"}], "stop": "x",
                                  "chat_template_kwargs": {"enable_thinking": False}})
    assert chat.prompt == ChatPrompt((("system", "a"), ("user", "b")), {"enable_thinking": False})
    assert chat.prompt.joined() == "a\nb" and chat.stop_list == ["x"]  # for a model without a template


def test_chat_template_kwargs_need_messages():
    with pytest.raises(InvalidRequest, match="chat_template_kwargs: a text input"):
        GenerateRequest.parse({"model": "m", "input": "abc", "chat_template_kwargs": {"x": 1}})
    # continuing a conversation, the string is its next user message: templated
    GenerateRequest.parse({"model": "m", "input": "abc", "chat_template_kwargs": {"x": 1}, "previous_response_id": "r"})


def test_a_conversation_without_text_is_an_empty_prompt():
    with pytest.raises(InvalidRequest, match="empty"):
        _ = GenerateRequest.parse({"model": "m", "input": [{"role": "user", "content": ""}]}).prompt


@pytest.mark.parametrize("messages,text", [
    # an output that starts with a line break follows its prompt as the model generated it
    ([("user", "def f(x):"), ("assistant", "\n    return x"), ("user", "def g():")],
     "def f(x):\n    return x\ndef g():"),
    # one that continues the line, and any other message, start a line of their own
    ([("user", "x = f("), ("assistant", "1)"), ("user", "\ny")], "x = f(\n1)\n\ny"),
    ([("system", "s"), ("assistant", "\na"), ("assistant", "\n\nb")], "s\na\n\nb"),
    ([("assistant", "\nfirst")], "\nfirst"),
])
def test_messages_are_joined_one_per_line_and_outputs_follow_their_prompts(messages, text):
    r = GenerateRequest.parse({"model": "m", "input": [{"role": role, "content": c} for role, c in messages]})
    assert r.prompt.joined() == text


@pytest.mark.parametrize("body,field", [
    ("not a dict", "JSON object"),
    ({"input": "x"}, "model"),
    ({"model": "m"}, "input"),
    ({"model": "m", "input": 3}, "input"),
    ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "role"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "x", "max_output_tokens": 2.5}, "max_output_tokens"),
    ({"model": "m", "input": "x", "temperature": 2.5}, "temperature"),
    ({"model": "m", "input": "x", "temperature": float("nan")}, "temperature"),
    ({"model": "m", "input": "x", "top_p": 0}, "top_p"),
    ({"model": "m", "input": "x", "seed": -1}, "seed"),
    ({"model": "m", "input": "x", "stop": ["a", "b", "c", "d", "e"]}, "at most 4"),
    ({"model": "m", "input": "x", "stop": [""]}, "stop"),
    ({"model": "m", "input": "x", "metadata": {"k": 1}}, "metadata"),
    ({"model": "m", "input": "x", "unknown": 1}, "unknown"),
    ({"model": "m", "input": "x", "id": ""}, "id"),
])
def test_bad_fields_are_named(body, field):
    with pytest.raises(InvalidRequest) as e:
        GenerateRequest.parse(body)
    code = "unsupported_parameter" if field == "unknown" else "invalid_request"  # a field no door maps
    assert field in str(e.value) and e.value.code == code and e.value.status == 400


@pytest.mark.parametrize("body,field", [
    ({"model": "m", "input": "a\ud800"}, "input: not valid Unicode"),
    ({"model": "m", "input": [{"role": "user", "content": "\udc00"}]}, "input.0.content: not valid Unicode"),
    ({"model": "m", "input": "x", "metadata": {"\ud800": "v"}}, "metadata (a key): not valid Unicode"),
    ({"model": "m", "input": "x", "metadata": {"k": "\ud800"}}, "metadata.k: not valid Unicode"),
    ({"model": "m\ud800", "input": "x"}, "model: "),  # a constrained string: pydantic refuses it itself
])
def test_lone_surrogates_are_refused_naming_the_field(body, field):
    """Hostile input: JSON carries lone surrogates as escapes (``"\\ud800"``), which no tokenizer
    takes (the lane failed with an internal error) and which ``POST /v1/responses`` could not encode
    when its answer echoed one in ``metadata`` (a 500)."""
    with pytest.raises(InvalidRequest) as e:
        GenerateRequest.parse(body)
    assert field in str(e.value)
    str(e.value).encode()  # the message itself is valid text


def test_empty_prompt():
    with pytest.raises(InvalidRequest, match="empty"):
        _ = GenerateRequest.parse({"model": "m", "input": ""}).prompt


def test_the_lane_request_carries_every_field_once_with_the_engines_defaults():
    import dataclasses

    from serve.request import LaneRequest
    from sharding.sampling import SamplingParams

    lane = GenerateRequest.parse({"model": "m", "input": [{"role": "user", "content": "a"}], "stop": "x"}).to_lane("r1")
    assert lane == LaneRequest(request_id="r1", prompt=ChatPrompt((("user", "a"),)), max_output_tokens=None, temperature=1.0, top_p=1.0,
                               seed=None, stop=("x",), ignore_eos=False, trace=None)
    assert (lane.temperature, lane.top_p) == (SamplingParams().temperature, SamplingParams().top_p)
    with pytest.raises(TypeError):  # no defaults of its own: every field comes from the front door
        LaneRequest(request_id="r2", prompt="a")
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(LaneRequest))
    greedy = GenerateRequest.parse({"model": "m", "input": "b", "temperature": 0, "max_output_tokens": 7,
                                    "seed": 3, "ignore_eos": True}).to_lane("r3", {"traceparent": "t"})
    assert (greedy.temperature, greedy.max_output_tokens, greedy.seed, greedy.ignore_eos, greedy.trace) == \
        (0, 7, 3, True, {"traceparent": "t"})
