"""Request validation: each bad field gets ``invalid_request`` naming it."""

from __future__ import annotations

import pytest

from serve.errors import InvalidRequest, UnsupportedParameter
from serve.request import ChatPrompt, GenerateRequest
from sharding.sampling import SamplingParams


def test_defaults_and_prompt_forms():
    r = GenerateRequest.parse({"model": "m", "input": "abc"})
    # unset sampling fields are the model's to default (serve.lanes.sampling)
    assert (r.temperature, r.top_p, r.top_k, r.max_output_tokens, r.stop_list, r.allow_spill) == \
        (None, None, None, None, [], False)
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
    ({"model": "m", "input": "x", "top_k": -2}, "top_k"),
    ({"model": "m", "input": "x", "top_k": 1.5}, "top_k"),
    ({"model": "m", "input": "x", "min_p": 1.5}, "min_p"),
    ({"model": "m", "input": "x", "min_tokens": -1}, "min_tokens"),
    ({"model": "m", "input": "x", "min_tokens": 5, "max_output_tokens": 4}, "min_tokens"),
    ({"model": "m", "input": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"model": "m", "input": "x", "stop_token_ids": "1"}, "stop_token_ids"),
    ({"model": "m", "input": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"model": "m", "input": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": "m", "input": "x", "frequency_penalty": -2.5}, "frequency_penalty"),
    ({"model": "m", "input": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"model": "m", "input": "x", "logit_bias": {"five": 1}}, "logit_bias"),
    ({"model": "m", "input": "x", "logit_bias": {"-5": 1}}, "logit_bias"),
    ({"model": "m", "input": "x", "logprobs": 21}, "logprobs"),
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

    lane = GenerateRequest.parse({"model": "m", "input": [{"role": "user", "content": "a"}], "stop": "x"}).to_lane("r1")
    assert lane == LaneRequest(request_id="r1", prompt=ChatPrompt((("user", "a"),)), max_output_tokens=None,
                               temperature=None, top_p=None, top_k=None, min_p=None, repetition_penalty=None,
                               presence_penalty=None, frequency_penalty=None, seed=None, logit_bias=None,
                               stop=("x",), stop_token_ids=(), min_tokens=0, logprobs=None, ignore_eos=False,
                               trace=None)
    with pytest.raises(TypeError):  # no defaults of its own: every field comes from the front door
        LaneRequest(request_id="r2", prompt="a")
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(LaneRequest))
    greedy = GenerateRequest.parse({"model": "m", "input": "b", "temperature": 0, "max_output_tokens": 7,
                                    "seed": 3, "ignore_eos": True}).to_lane("r3", {"traceparent": "t"})
    assert (greedy.temperature, greedy.max_output_tokens, greedy.seed, greedy.ignore_eos, greedy.trace) == \
        (0, 7, 3, True, {"traceparent": "t"})
    every = GenerateRequest.parse({"model": "m", "input": "b", "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2,
                                   "presence_penalty": -1, "frequency_penalty": 2, "logit_bias": {"7": -100, "9": 2.5},
                                   "stop_token_ids": [3, 4], "min_tokens": 2}).to_lane("r4")
    assert (every.top_k, every.min_p, every.repetition_penalty, every.presence_penalty, every.frequency_penalty,
            every.logit_bias, every.stop_token_ids, every.min_tokens) == (5, 0.1, 1.2, -1, 2, {7: -100, 9: 2.5},
                                                                          (3, 4), 2)


def test_unset_sampling_fields_take_the_models_generation_config_then_the_engines_defaults(tmp_path):
    """As vLLM's ``--generation-config auto``: ``generation_config.json``'s temperature, top_p, top_k,
    min_p and penalties where the request leaves them unset; the request's own values win; the
    model's end-of-turn ids join ``stop_token_ids`` unless ``ignore_eos``."""
    import json

    from serve.lanes.sampling import engine_request, generation_defaults

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05, "do_sample": True,
         "eos_token_id": [1, 7], "max_new_tokens": 99}))
    defaults = generation_defaults(tmp_path)
    assert defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05}

    def sampling(body: dict, **kw) -> SamplingParams:
        lane = GenerateRequest.parse({"model": "m", "input": "b", **body}).to_lane("r")
        return engine_request(lane, [5], 8, defaults=defaults, stop_ids=(1, 7), vocab_size=50, **kw).sampling()

    p = sampling({})
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.presence_penalty) == (0.6, 0.9, 20, 0.0, 1.05, 0.0)
    p = sampling({"temperature": 0, "top_k": -1, "repetition_penalty": 1, "stop_token_ids": [3]})
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.stop_token_ids) == (0, 0.9, -1, 1, (3, 1, 7))
    assert sampling({"ignore_eos": True, "stop_token_ids": [3]}).stop_token_ids == (3,)
    plain = engine_request(GenerateRequest.parse({"model": "m", "input": "b"}).to_lane("r"), [5], 8,
                           defaults=generation_defaults(tmp_path / "none"), stop_ids=(), vocab_size=50).sampling()
    assert plain == SamplingParams(max_tokens=8)
    with pytest.raises(InvalidRequest, match="logit_bias: token ids \\[50\\]"):
        sampling({"logit_bias": {"50": 1}})
    with pytest.raises(InvalidRequest, match="min_tokens"):
        sampling({"min_tokens": 9})
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 0}))
    with pytest.raises(ValueError, match="top_p"):
        generation_defaults(tmp_path)


LP = "message.output_text.logprobs"


@pytest.mark.parametrize("fields,logprobs", [
    ({"include": [LP]}, 0),  # the sampled tokens' own, as vLLM's Responses API (top_logprobs defaults to 0)
    ({"include": [LP], "top_logprobs": 3}, 3),
    ({"include": [LP], "top_logprobs": 3, "logprobs": 3}, 3),
    ({"include": [], "top_logprobs": 0}, None),  # neutral
    ({"logprobs": 5}, 5),
])
def test_responses_include_and_top_logprobs_are_logprobs(fields, logprobs):
    assert GenerateRequest.parse({"model": "m", "input": "x", **fields}).logprobs == logprobs


@pytest.mark.parametrize("fields,error,says", [
    ({"top_logprobs": 2}, InvalidRequest, "top_logprobs: needs include"),
    ({"include": [LP], "top_logprobs": 2, "logprobs": 4}, InvalidRequest, "logprobs: 4 disagrees"),
    ({"include": [LP], "top_logprobs": 21}, InvalidRequest, "top_logprobs"),
    ({"include": ["reasoning.encrypted_content"]}, UnsupportedParameter, "include: 'reasoning.encrypted_content'"),
    ({"include": "message.output_text.logprobs"}, InvalidRequest, "include"),  # a list, as OpenAI's
])
def test_bad_include_and_top_logprobs_are_refused_naming_the_field(fields, error, says):
    with pytest.raises(error, match=says) as e:
        GenerateRequest.parse({"model": "m", "input": "x", **fields})
    assert type(e.value) is error  # unsupported_parameter for what is not served, invalid_request else


@pytest.mark.parametrize("field,value", [("n", 2), ("best_of", 2), ("echo", True), ("bad_words", ["x"]),
                                         ("allowed_token_ids", [1]), ("prompt_logprobs", 0)])
def test_vllms_unserved_sampling_fields_are_unsupported_by_name(field, value):
    """The WebSocket's (and the router's) request: a field of vLLM's ``SamplingParams`` it does not serve
    is ``unsupported_parameter`` naming it, never dropped."""
    with pytest.raises(UnsupportedParameter, match=f"^{field}: unknown parameter"):
        GenerateRequest.parse({"model": "m", "input": "x", field: value})


def test_the_output_budget_is_the_requests_else_the_models_max_new_tokens_capped_by_the_context(tmp_path):
    """vLLM's ``get_max_tokens`` for a request without ``max_tokens``: min(the rest of the context, the
    generation config's ``max_new_tokens``); a request's own budget past the context is ``prompt_too_long``."""
    import json

    from serve.lanes.sampling import default_max_tokens, output_budget
    from sharding.errors import PromptTooLong

    assert default_max_tokens(tmp_path) is None  # no generation_config.json
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 64, "eos_token_id": 1}))
    assert default_max_tokens(tmp_path) == 64
    assert output_budget(None, 10, 512, 64, "m") == 64
    assert output_budget(None, 500, 512, 64, "m") == 12  # the rest of the context is less
    assert output_budget(None, 10, 512, None, "m") == 502
    assert output_budget(200, 10, 512, 64, "m") == 200  # the request's own wins
    with pytest.raises(PromptTooLong, match="with max_output_tokens 600"):
        output_budget(600, 10, 512, 64, "m")
    with pytest.raises(PromptTooLong):
        output_budget(None, 512, 512, 64, "m")
    for bad in (0, 2.5, "64", True):
        (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": bad}))
        with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
            default_max_tokens(tmp_path)
