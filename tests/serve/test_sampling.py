"""The sampling parameters from every front door to every lane's engine (``serve.lanes.sampling``),
and end to end over the ``openai`` package, in process, on a real exact lane (fastmode's speculative
engine on the shipped models under a ChatML template: ``tests.serve.exact_app``, as ``test_chat_app.py``):

- every lane and the fast lane's door hand their engine the request's ``top_k``, ``min_p``,
  penalties, ``logit_bias``, ``stop_token_ids`` and ``min_tokens``, the unset ones from the
  checkpoint's ``generation_config.json``; the vLLM lanes give vLLM's ``SamplingParams`` the same;
- chat completions, completions, Responses, the WebSocket and gRPC carry them to the router;
- greedy output under ``repetition_penalty``, ``logit_bias``, ``min_tokens`` and
  ``stop_token_ids`` is transformers' ``generate`` with its processors; under ``presence_penalty``
  and ``frequency_penalty``, ``generate`` with vLLM's own ``apply_penalties`` as its processor; a
  ``generation_config.json`` ``repetition_penalty`` applies as transformers applies it;
- a value out of range is a 400 ``invalid_request`` naming the field;
- log probabilities over chat completions, completions and the WebSocket are transformers'
  log-softmax within 1e-3;
- vLLM's own engine (the priority lane's, in process) and fastmode's executor and speculative engine
  give the same greedy tokens under each processing field, and log probabilities within 1e-3.
"""

from __future__ import annotations

import asyncio
import json
import socket

import openai
import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

from models import TEST_FAST, TEST_FULL
from serve.lanes.lane import LANES, Lane
from serve.request import GenerateRequest
from tests.conftest import shipped
from tests.serve.chat_models import CHATML, with_template
from tests.serve.exact_app import exact_lane_app
from tests.serve.test_chat_prompts import Recording, run

DEFAULTS = {"repetition_penalty": 1.3, "top_k": 7, "min_p": 0.01}
"""What the test checkpoint's ``generation_config.json`` recommends (transformers' ``generate`` reads
its ``repetition_penalty`` too; the others matter only when sampling)."""

EVERY = {"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": -0.5,
         "logit_bias": {"7": -100, "9": 2.5}, "stop_token_ids": [11], "min_tokens": 3}


def with_defaults(src, out, defaults=DEFAULTS):
    path = with_template(src, out, CHATML)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps(config | defaults, indent=2))
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampling")
    return with_defaults(shipped(TEST_FULL), root / "full"), with_template(shipped(TEST_FAST), root / "fast", CHATML)


# -- every lane, the door and every front door ------------------------------------------------------
@pytest.mark.parametrize("name", LANES)
def test_every_lane_hands_its_engine_the_requests_sampling_over_the_models_defaults(checkpoints, name):
    full, _ = checkpoints
    engine = Recording()
    lane = Lane(name, "m", str(full), {}, engine=engine)
    run(lane, {"input": "x", **EVERY, "max_output_tokens": 8})
    p = engine.requests[-1].sampling()
    assert (p.top_k, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty, p.logit_bias,
            p.stop_token_ids, p.min_tokens) == (5, 0.05, 1.2, 0.5, -0.5, ((7, -100), (9, 2.5)), (11, 1), 3)
    run(lane, {"input": "x", "max_output_tokens": 8})  # unset: the checkpoint's, else the engines'
    p = engine.requests[-1].sampling()
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.presence_penalty, p.logit_bias,
            p.min_tokens) == (1.0, 1.0, 7, 0.01, 1.3, 0.0, (), 0)
    with pytest.raises(Exception, match=r"logit_bias: token ids \[99999\]") as e:
        run(lane, {"input": "x", "logit_bias": {"99999": 1}})
    assert e.value.code == "invalid_request"


def test_the_door_hands_the_head_the_same_sampling(checkpoints, tmp_path):
    from serve.lanes.door import Door, DoorConnection, DoorSpec
    from sharding.config import ModelConfig

    fast = with_defaults(shipped(TEST_FAST), tmp_path / "fast")
    door = Door(DoorSpec(model_id="m", model_path=str(fast), price=1.0, host="127.0.0.1"),
                ModelConfig.from_pretrained(fast), 512)
    a, b = socket.socketpair()
    try:
        conn = DoorConnection(door, a, 0)
        body = {"model": "m", "input": "x", **EVERY, "max_output_tokens": 8}
        _, _, _, p = conn._create("r", body, json.dumps(body).encode())
        assert (p.top_k, p.repetition_penalty, p.logit_bias, p.stop_token_ids, p.min_tokens) == \
            (5, 1.2, ((7, -100), (9, 2.5)), (11, 1), 3)
        _, _, _, p = conn._create("s", {"model": "m", "input": "x"}, b"{}")
        assert (p.top_k, p.min_p, p.repetition_penalty) == (7, 0.01, 1.3)
    finally:
        door.close()
        b.close()


def test_generation_configs_max_new_tokens_is_the_default_max_tokens_on_every_lane_and_the_door(tmp_path):
    """As vLLM's ``--generation-config auto`` (``get_diff_sampling_param`` makes ``max_new_tokens`` the
    default ``max_tokens``; ``get_max_tokens`` caps it by the rest of the context): a request without
    ``max_output_tokens`` gets ``max_new_tokens``, one with it its own."""
    from serve.lanes.door import Door, DoorConnection, DoorSpec
    from sharding.config import ModelConfig

    path = with_defaults(shipped(TEST_FULL), tmp_path / "full", {"max_new_tokens": 5})
    for name in LANES:
        engine = Recording()
        lane = Lane(name, "m", str(path), {}, engine=engine)
        run(lane, {"input": "x"})
        run(lane, {"input": "x", "max_output_tokens": 20})
        assert [r.max_tokens for r in engine.requests] == [5, 20], name
    door = Door(DoorSpec(model_id="m", model_path=str(path), price=1.0, host="127.0.0.1"),
                ModelConfig.from_pretrained(path), 512)
    a, b = socket.socketpair()
    try:
        conn = DoorConnection(door, a, 0)
        assert conn._create("r", {"model": "m", "input": "x"}, b"{}")[3].max_tokens == 5
        assert conn._create("s", {"model": "m", "input": "x", "max_output_tokens": 9}, b"{}")[3].max_tokens == 9
    finally:
        door.close()
        b.close()
    engine = Recording()
    run(Lane("standard", "m", str(shipped(TEST_FULL)), {}, engine=engine), {"input": "x"})  # no max_new_tokens
    assert engine.requests[-1].max_tokens == engine.max_len - len(engine.requests[-1].prompt_ids)


def test_the_exact_lane_on_vllm_refuses_what_its_speculative_decoding_refuses_before_accepting(checkpoints):
    """The lane asks its engine's ``check_request`` before ``accepted``: on vLLM's exact lane a
    ``logit_bias`` is a plain ``unsupported_parameter`` naming it, never a failure mid-stream."""
    from serve.errors import UnsupportedParameter
    from serve.lanes.vllm_engine import VLLMLaneEngine

    class Speculative(Recording):
        speculative = True
        check_request = VLLMLaneEngine.check_request

    full, _ = checkpoints
    engine = Speculative()
    lane = Lane("exact", "m", str(full), {"engine": "vllm"}, engine=engine)
    with pytest.raises(UnsupportedParameter, match="^logit_bias: not served by the exact lane on vLLM"):
        run(lane, {"input": "x", "temperature": 0, "logit_bias": {"7": 2}})
    assert engine.requests == [] and lane.in_flight == 0
    run(lane, {"input": "x", "temperature": 0, "max_output_tokens": 4})  # the checkpoint's min_p: greedy, served
    assert len(engine.requests) == 1


def test_the_vllm_lanes_hand_vllm_the_same_sampling():
    """vLLM's own ``SamplingParams`` built from the engine request (``VLLMLaneEngine`` passes it to
    ``AsyncLLM.generate``; ``test_chat_prompts.py`` checks that path with a stand-in)."""
    from serve.lanes.engine import EngineRequest

    request = EngineRequest("r", [0, 5], 8, temperature=0.5, top_p=0.9, top_k=5, min_p=0.05, repetition_penalty=1.2,
                            presence_penalty=0.5, frequency_penalty=-0.5, logit_bias=((7, -100.0), (9, 2.5)), seed=3,
                            stop_token_ids=(11, 1), min_tokens=3)
    v = request.vllm_sampling()
    assert (v.temperature, v.top_p, v.top_k, v.min_p, v.repetition_penalty, v.presence_penalty, v.frequency_penalty,
            v.logit_bias, v.seed, v.stop_token_ids, v.min_tokens, v.max_tokens) == \
        (0.5, 0.9, 5, 0.05, 1.2, 0.5, -0.5, {7: -100.0, 9: 2.5}, 3, [11, 1], 3, 8)
    plain = EngineRequest("r", [0], 8).vllm_sampling()
    assert (plain.top_k, plain.repetition_penalty, plain.logit_bias, plain.min_tokens) == (0, 1.0, None, 0)


def test_every_front_door_carries_the_sampling_to_the_router():
    from serve.openai_responses import ResponsesRequest
    from serve.openai_schema import ChatCompletionRequest, CompletionRequest, parse
    from serve.rpc import inference_pb2 as pb
    from serve.rpc.server import to_request

    def lane(body: dict):
        r = GenerateRequest.parse(body).to_lane("r")
        return (r.top_k, r.min_p, r.repetition_penalty, r.presence_penalty, r.frequency_penalty, r.logit_bias,
                r.stop_token_ids, r.min_tokens)

    want = (5, 0.05, 1.2, 0.5, -0.5, {7: -100, 9: 2.5}, (11,), 3)
    messages = [{"role": "user", "content": "u"}]
    assert lane(parse(ChatCompletionRequest, {"model": "m", "messages": messages, **EVERY}).generate_request("c")) == want
    assert lane(parse(CompletionRequest, {"model": "m", "prompt": "x", **EVERY}).generate_request("t")) == want
    assert lane(ResponsesRequest(model="m", input="u", **EVERY).generate_request("r")) == want
    assert lane({"model": "m", "input": "x", **EVERY}) == want  # the WebSocket's response.create
    grpc = pb.GenerateRequest(model="m", text="x", top_k=5, min_p=0.05, repetition_penalty=1.2, presence_penalty=0.5,
                              frequency_penalty=-0.5, logit_bias={7: -100, 9: 2.5}, stop_token_ids=[11], min_tokens=3)
    assert lane(to_request(grpc, {})) == want
    assert lane(to_request(pb.GenerateRequest(model="m", text="x"), {})) == (None,) * 5 + (None, (), 0)


# -- end to end over the openai package ----------------------------------------------------------------
@pytest.fixture(scope="module")
def app(checkpoints):
    with exact_lane_app(*checkpoints, "s") as a:
        yield a


QUESTION = [{"role": "user", "content": "def parse(line):"}]
N = 24


def hf_generate(path, ids: list[int], **kw) -> list[int]:
    """transformers' greedy ``generate`` on ``path`` (whose ``generation_config.json`` it reads)."""
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=N,
                             pad_token_id=model.config.pad_token_id, **kw)
    return out[0, len(ids):].tolist()


def prompt_ids(path) -> list[int]:
    return AutoTokenizer.from_pretrained(path).apply_chat_template(QUESTION, add_generation_prompt=True,
                                                                    tokenize=True, return_dict=False)


def text_of(path, ids: list[int]) -> str:
    return AutoTokenizer.from_pretrained(path).decode(ids, skip_special_tokens=True)


def chat(app, **kw):
    return app["client"].chat.completions.create(**{"model": "s-full", "service_tier": "exact", "messages": QUESTION,
                                                    "max_tokens": N, "temperature": 0, **kw})


def test_the_checkpoints_repetition_penalty_applies_unless_the_request_sets_one(app):
    ids, full = prompt_ids(app["full"]), app["full"]
    r = chat(app)
    want = hf_generate(full, ids)  # transformers applies generation_config.json's repetition_penalty too
    assert want != hf_generate(full, ids, repetition_penalty=1.0)
    assert r.choices[0].message.content == text_of(full, want) and r.usage.completion_tokens == len(want)
    assert app["spy"].requests[-1].repetition_penalty == 1.3
    r = chat(app, extra_body={"repetition_penalty": 1.0})
    assert r.choices[0].message.content == text_of(full, hf_generate(full, ids, repetition_penalty=1.0))


def test_logit_bias_min_tokens_and_stop_token_ids_are_transformers_processors(app):
    """``logit_bias`` (transformers' ``sequence_bias``), ``min_tokens`` (``min_new_tokens``), vLLM's
    ``repetition_penalty`` and ``stop_token_ids`` (``generate``'s ``eos_token_id``), over chat completions:
    the same tokens; the stop token's text is not returned, ``finish_reason`` is stop."""
    ids, full = prompt_ids(app["full"]), app["full"]
    free = hf_generate(full, ids, repetition_penalty=1.0)
    bias = {free[0]: -100.0, free[2]: -100.0}
    hf_bias = [[[t], b] for t, b in bias.items()]
    biased = hf_generate(full, ids, repetition_penalty=1.0, sequence_bias=hf_bias)
    stop = biased[8]
    want = hf_generate(full, ids, repetition_penalty=1.5, sequence_bias=hf_bias, min_new_tokens=4,
                       eos_token_id=[1, stop])
    r = chat(app, logit_bias={str(t): b for t, b in bias.items()},
             extra_body={"repetition_penalty": 1.5, "min_tokens": 4, "stop_token_ids": [stop]})
    assert want != free and len(want) < N
    assert r.usage.completion_tokens == len(want) and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text_of(full, want[:-1])
    # min_tokens past the stop token's first place: it cannot end the output earlier
    first = biased.index(stop)
    later = hf_generate(full, ids, repetition_penalty=1.0, sequence_bias=hf_bias, min_new_tokens=first + 2,
                        eos_token_id=[1, stop])
    r = chat(app, logit_bias={str(t): b for t, b in bias.items()},
             extra_body={"repetition_penalty": 1.0, "min_tokens": first + 2, "stop_token_ids": [stop]})
    assert r.usage.completion_tokens == len(later) > first + 1


class VLLMPenalties(LogitsProcessor):
    """vLLM's own ``apply_penalties`` as a transformers logits processor: OpenAI's presence and
    frequency penalties over the tokens generated after ``prompt_len``."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        from vllm.model_executor.layers.utils import apply_penalties

        vocab = scores.shape[-1]
        output = torch.cat([input_ids[:, self.prompt_len:], torch.full((1, 1), vocab)], dim=1)  # padded with V
        return apply_penalties(scores.clone(), input_ids[:, :self.prompt_len], output, torch.tensor([self.presence]),
                               torch.tensor([self.frequency]), torch.tensor([1.0]))


@pytest.mark.parametrize("presence,frequency", [(1.5, 0.0), (0.0, 2.0), (-0.5, 1.0)])
def test_presence_and_frequency_penalties_are_vllms(app, presence, frequency):
    ids, full = prompt_ids(app["full"]), app["full"]
    want = hf_generate(full, ids, repetition_penalty=1.0,
                       logits_processor=LogitsProcessorList([VLLMPenalties(len(ids), presence, frequency)]))
    assert want != hf_generate(full, ids, repetition_penalty=1.0)
    r = chat(app, presence_penalty=presence, frequency_penalty=frequency, extra_body={"repetition_penalty": 1.0})
    assert r.choices[0].message.content == text_of(full, want)


def test_top_k_one_is_greedy_and_seeded_sampling_repeats(app):
    greedy = chat(app, extra_body={"repetition_penalty": 1.0}).choices[0].message.content
    one = chat(app, temperature=1.0, seed=5, extra_body={"repetition_penalty": 1.0, "top_k": 1})
    assert one.choices[0].message.content == greedy
    kw = dict(temperature=1.0, seed=9, presence_penalty=0.3, extra_body={"top_k": 20, "min_p": 0.05, "min_tokens": 5})
    a, b = chat(app, **kw), chat(app, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content and a.usage.completion_tokens >= 5


@pytest.mark.parametrize("kw,param", [
    (dict(presence_penalty=3), "presence_penalty"), (dict(frequency_penalty=-2.5), "frequency_penalty"),
    (dict(logit_bias={"5": 200}), "logit_bias"), (dict(logit_bias={"99999": 1}), "logit_bias"),
    (dict(extra_body={"top_k": -3}), "top_k"), (dict(extra_body={"min_p": 2}), "min_p"),
    (dict(extra_body={"repetition_penalty": 0}), "repetition_penalty"), (dict(extra_body={"min_tokens": 99}), "min_tokens"),
    (dict(extra_body={"stop_token_ids": [-1]}), "stop_token_ids"),
])
def test_out_of_range_values_are_400s_naming_the_field(app, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(app, **kw)
    assert (e.value.code, e.value.param) == ("invalid_request", param), e.value.body


def test_responses_and_the_websocket_take_the_same_parameters(app):
    client, http, spy, full = app["client"], app["http"], app["spy"], app["full"]
    client.responses.create(model="s-full", service_tier="exact", input=QUESTION, max_output_tokens=6, temperature=0,
                            extra_body={"top_k": 3, "logit_bias": {"7": -100}, "presence_penalty": 1.0, "min_tokens": 2})
    sent = spy.requests[-1]
    assert (sent.top_k, sent.logit_bias, sent.presence_penalty, sent.min_tokens) == (3, ((7, -100.0),), 1.0, 2)
    with http.websocket_connect("/v1/responses") as ws:
        ws.send_text(json.dumps({"type": "response.create", "id": "w", "model": "s-full", "service_tier": "exact",
                                 "input": QUESTION, "max_output_tokens": 4, "temperature": 0,
                                 "logit_bias": {"9": 3}, "frequency_penalty": 0.5, "stop_token_ids": [5]}))
        while (got := json.loads(ws.receive_text()))["type"] != "response.completed":
            assert got["type"] != "error", got
        ws.send_text(json.dumps({"type": "response.create", "id": "bad", "model": "s-full", "input": "x",
                                 "min_p": -1}))
        got = json.loads(ws.receive_text())
        assert (got["type"], got["code"]) == ("error", "invalid_request") and "min_p" in got["message"]
    sent = spy.requests[-1]
    assert (sent.logit_bias, sent.frequency_penalty, sent.stop_token_ids[0]) == (((9, 3.0),), 0.5, 5)


def hf_logprobs(path, ids: list[int], out: list[int]) -> torch.Tensor:
    """transformers' log-softmax ``[T, V]`` of the logits that chose each of ``out``'s tokens."""
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids + out])).logits[0, len(ids) - 1:-1]
    return torch.log_softmax(logits, dim=-1)


def test_chat_logprobs_are_transformers_log_softmax(app):
    """``logprobs`` with ``top_logprobs`` over chat completions, whole and streamed, on the exact lane
    (drafted tokens included): each token's and its top 3's log probabilities within 1e-3 of
    transformers' log-softmax of the full model's logits there, as vLLM's default (raw logits: the
    repetition penalty from ``generation_config.json`` does not change them)."""
    ids, full = prompt_ids(app["full"]), app["full"]
    r = chat(app, logprobs=True, top_logprobs=3)
    out = hf_generate(full, ids)
    assert r.usage.completion_tokens == len(out)
    ref, tok = hf_logprobs(full, ids, out), AutoTokenizer.from_pretrained(full)
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == [tok.decode([t]) for t in out]
    for t, (c, token) in enumerate(zip(content, out, strict=True)):
        assert abs(c.logprob - ref[t, token].item()) < 1e-3
        values, order = ref[t].topk(3)
        assert [x.token for x in c.top_logprobs] == [tok.decode([i]) for i in order.tolist()]
        assert max(abs(x.logprob - v) for x, v in zip(c.top_logprobs, values.tolist(), strict=True)) < 1e-3
        assert c.bytes == list(c.token.encode())
    streamed = chat(app, logprobs=True, top_logprobs=3, stream=True)
    entries = [e for ch in streamed if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in entries] == [c.token for c in content]  # the same tokens; the adaptive k may differ,
    assert max(abs(e.logprob - c.logprob) for e, c in zip(entries, content)) < 1e-4  # so float noise may too
    assert chat(app).choices[0].logprobs is None


def test_completion_logprobs_and_the_websockets(app):
    client, http, full = app["client"], app["http"], app["full"]
    ids = AutoTokenizer.from_pretrained(full)("def parse(line):").input_ids
    r = client.completions.create(model="s-full", prompt="def parse(line):", max_tokens=8, temperature=0, logprobs=2,
                                  extra_body={"service_tier": "exact", "repetition_penalty": 1.0, "ignore_eos": True})
    out = hf_generate(full, ids, repetition_penalty=1.0)[:8]
    ref = hf_logprobs(full, ids, out)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 8 and lp.text_offset[0] == 0
    assert max(abs(a - ref[t, token].item()) for t, (a, token) in enumerate(zip(lp.token_logprobs, out))) < 1e-3
    assert all(len(top) in (2, 3) and lp.tokens[t] in top for t, top in enumerate(lp.top_logprobs))
    assert lp.text_offset == [sum(len(x) for x in lp.tokens[:t]) for t in range(8)]
    with http.websocket_connect("/v1/responses") as ws:
        ws.send_text(json.dumps({"type": "response.create", "id": "w", "model": "s-full", "service_tier": "exact",
                                 "input": "def parse(line):", "max_output_tokens": 8, "temperature": 0,
                                 "repetition_penalty": 1.0, "ignore_eos": True, "logprobs": 1}))
        entries = []
        while (got := json.loads(ws.receive_text()))["type"] != "response.completed":
            assert got["type"] != "error", got
            entries += got.get("logprobs") or []
    assert [e["id"] for e in entries] == out and all(len(e["top_logprobs"]) == 1 for e in entries)
    assert max(abs(e["logprob"] - ref[t, e["id"]].item()) for t, e in enumerate(entries)) < 1e-3


def test_responses_include_logprobs_over_http_and_the_websocket(app):
    """OpenAI Responses' ``include: ["message.output_text.logprobs"]`` with ``top_logprobs``, over the
    ``openai`` client (whole and streamed) and the WebSocket, on the real exact lane: each token's and
    its top 2's log probabilities within 1e-3 of transformers' log-softmax."""
    client, http, full = app["client"], app["http"], app["full"]
    ids, tok = prompt_ids(full), AutoTokenizer.from_pretrained(full)
    params = {"model": "s-full", "service_tier": "exact", "input": QUESTION, "max_output_tokens": 8, "temperature": 0,
              "include": ["message.output_text.logprobs"], "top_logprobs": 2,
              "extra_body": {"repetition_penalty": 1.0, "ignore_eos": True}}
    r = client.responses.create(**params)
    out = hf_generate(full, ids, repetition_penalty=1.0)[:8]
    ref = hf_logprobs(full, ids, out)
    logprobs = r.output[0].content[0].logprobs
    assert [lp.token for lp in logprobs] == [tok.decode([t]) for t in out]
    for t, (lp, token) in enumerate(zip(logprobs, out, strict=True)):
        assert abs(lp.logprob - ref[t, token].item()) < 1e-3 and lp.bytes == list(lp.token.encode())
        values, order = ref[t].topk(2)
        assert [x.token for x in lp.top_logprobs] == [tok.decode([i]) for i in order.tolist()]
        assert max(abs(x.logprob - v) for x, v in zip(lp.top_logprobs, values.tolist(), strict=True)) < 1e-3
    events = list(client.responses.create(**params, stream=True))
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    # The same tokens; the values within float noise (a second request may reuse the first's cached
    # keys and values and verify with another k: other sums; rounding both would fail at a boundary).
    assert [lp.token for lp in streamed] == [lp.token for lp in logprobs]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(streamed, logprobs, strict=True)) < 1e-4
    with http.websocket_connect("/v1/responses") as ws:
        ws.send_text(json.dumps({"type": "response.create", "id": "w", "model": "s-full", "service_tier": "exact",
                                 "input": QUESTION, "max_output_tokens": 8, "temperature": 0, "repetition_penalty": 1.0,
                                 "ignore_eos": True, "include": ["message.output_text.logprobs"], "top_logprobs": 2}))
        entries = []
        while (got := json.loads(ws.receive_text()))["type"] != "response.completed":
            assert got["type"] != "error", got
            entries += got.get("logprobs") or []
    assert [e["id"] for e in entries] == out and all(len(e["top_logprobs"]) == 2 for e in entries)
    assert max(abs(e["logprob"] - ref[t, e["id"]].item()) for t, e in enumerate(entries)) < 1e-3


def test_tokens_after_a_stop_string_are_dropped_with_their_logprobs(app):
    """As vLLM's output processor (``_trim_surplus_tokens``): when a stop string is completed by a token
    of a step that produced several (the exact tier accepts drafts together), the tokens after it are
    not output: ``usage`` counts the tokens through the one completing it, and ``logprobs`` has one
    entry each, transformers' greedy tokens, whole and streamed."""
    client, full = app["client"], app["full"]
    ids, tok = prompt_ids(full), AutoTokenizer.from_pretrained(full)
    out = hf_generate(full, ids)  # the checkpoint's repetition_penalty, as the lane applies it
    text = tok.decode(out, skip_special_tokens=True)
    # a stop string that the k-th token completes, first found there (so tokens k+1.. come after it):
    # the last 3 characters of the first k tokens' text
    k, stop = next((k, piece) for k in range(4, len(out) - 2)
                   if len(piece := tok.decode(out[:k], skip_special_tokens=True)[-3:]) == 3
                   and stop_completed_at(tok, out, piece) == k)
    params = {"logprobs": True, "stop": [stop]}
    r = chat(app, **params)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == text[:text.index(stop)]
    assert r.usage.completion_tokens == k
    assert [c.token for c in r.choices[0].logprobs.content] == [tok.decode([t]) for t in out[:k]]
    streamed = [e.token for ch in chat(app, **params, stream=True) if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    assert streamed == [tok.decode([t]) for t in out[:k]]


def stop_completed_at(tok, out: list[int], stop: str) -> int | None:
    """The number of tokens of ``out`` whose text first contains ``stop``."""
    return next((k for k in range(1, len(out) + 1) if stop in tok.decode(out[:k], skip_special_tokens=True)), None)


# -- against vLLM itself -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_engine():
    """The priority lane's engine (vLLM's ``AsyncLLM``, in process) on the shipped full model."""
    from serve.config import PriorityLaneConfig
    from serve.lanes.vllm_engine import VLLMLaneEngine

    with asyncio.Runner() as runner:
        e = VLLMLaneEngine(shipped(TEST_FULL), PriorityLaneConfig())
        e.run = runner.run
        yield e
        e.shutdown()


@pytest.mark.slow
def test_vllm_and_fastmodes_engines_process_the_same_tokens(vllm_engine):
    """Greedy under each processing field: vLLM's own engine (the priority and standard lanes), fastmode's
    executor (the fast lane's) and its speculative engine (the exact tier's) on the same checkpoint give
    the same tokens, and each field changed them."""
    from serve.lanes.engine import EngineRequest
    from sharding.engine import Engine
    from sharding.speculative import SpeculativeEngine

    full = shipped(TEST_FULL)
    ids = AutoTokenizer.from_pretrained(full)("def parse(line):\n").input_ids
    n = 24
    executor = Engine.from_pretrained(full, num_slots=2)
    spec = SpeculativeEngine.from_pretrained(full, shipped(TEST_FAST), num_slots=2, k=3, adaptive=False)
    free = executor.generate([ids], EngineRequest("f", ids, n, temperature=0, ignore_eos=True).sampling())[0]
    cases = [dict(repetition_penalty=1.5), dict(repetition_penalty=0.7), dict(presence_penalty=1.5),
             dict(frequency_penalty=2.0), dict(presence_penalty=-0.5, frequency_penalty=1.0),
             dict(logit_bias=((free[0], -100.0), (free[3], -100.0), (7, 3.0))),
             dict(min_tokens=6, stop_token_ids=(free[2],)), dict(repetition_penalty=1.2, logit_bias=((free[1], -5.0),))]

    async def vllm(request: EngineRequest) -> list[int]:
        return [t async for o in vllm_engine.generate(request) for t in o.token_ids]

    for i, case in enumerate(cases):
        request = EngineRequest(f"c{i}", ids, n, temperature=0, ignore_eos="stop_token_ids" not in case, **case)
        theirs = vllm_engine.run(vllm(request))
        assert theirs != free, case
        assert executor.generate([ids], request.sampling())[0] == theirs, case
        assert spec.generate([ids], request.sampling())[0] == theirs, case


@pytest.mark.slow
def test_vllms_logprobs_are_fastmodes_within_1e_3(vllm_engine):
    """The same request's log probabilities (the token's and the top 5's) from vLLM's engine, fastmode's
    executor and its speculative engine, greedy and under a repetition penalty (raw logprobs: the
    penalty changes the tokens, not how their log probabilities are taken)."""
    from serve.lanes.engine import EngineRequest
    from sharding.engine import Engine
    from sharding.speculative import SpeculativeEngine
    from tests.sharding.test_engine import logprobs_run

    full = shipped(TEST_FULL)
    ids = AutoTokenizer.from_pretrained(full)("def parse(line):\n").input_ids
    engines = {"executor": Engine.from_pretrained(full, num_slots=2),
               "speculative": SpeculativeEngine.from_pretrained(full, shipped(TEST_FAST), num_slots=2, k=3, adaptive=False)}

    async def vllm(request: EngineRequest) -> tuple[list[int], list]:
        tokens, lps = [], []
        async for o in vllm_engine.generate(request):
            tokens += o.token_ids
            lps += o.logprobs
        return tokens, lps

    for i, case in enumerate([{}, {"repetition_penalty": 1.4}]):
        request = EngineRequest(f"lp{i}", ids, 16, temperature=0, ignore_eos=True, logprobs=5, **case)
        tokens, theirs = vllm_engine.run(vllm(request))
        for name, engine in engines.items():
            ours_tokens, ours = logprobs_run(engine, f"{name}{i}", ids, request.sampling())
            assert ours_tokens == tokens, name
            for (a, a_ids, a_lps), (b, b_ids, b_lps) in zip(ours, theirs, strict=True):
                assert abs(a - b) < 1e-3 and a_ids == b_ids, name
                assert max(abs(x - y) for x, y in zip(a_lps, b_lps, strict=True)) < 1e-3, name


@pytest.mark.full  # vLLM's speculative engine with its draft (about 40 s on 2 cores): the exact lane's option, not its default
def test_the_exact_lane_on_vllm_processes_and_takes_logprobs_as_fastmodes_engine():
    """``lanes.exact.engine: vllm`` (vLLM's ``draft_model`` speculative decoding, the fast model drafting):
    greedy under the penalties and ``min_tokens`` gives fastmode's speculative engine's tokens (vLLM's
    rejection sampler processes the drafts' positions as its sampler does), its log probabilities are
    within 1e-3 of fastmode's, a greedy request's ``min_p`` (a model default, say) changes nothing; what
    vLLM's speculative decoding refuses (``logit_bias``, a sampled ``min_p``) is ``unsupported_parameter``
    naming it, before anything runs (sampled requests for the exact tier run on priority anyway:
    ``route.sampled_on``)."""
    from serve.config import ExactLaneConfig
    from serve.errors import UnsupportedParameter
    from serve.lanes.engine import EngineRequest
    from serve.lanes.vllm_engine import VLLMLaneEngine
    from sharding.speculative import SpeculativeEngine
    from tests.sharding.test_engine import logprobs_run

    full, fast = shipped(TEST_FULL), shipped(TEST_FAST)
    ids = AutoTokenizer.from_pretrained(full)("def parse(line):\n").input_ids
    spec = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False)
    free = spec.generate([ids], EngineRequest("f", ids, 24, temperature=0, ignore_eos=True).sampling())[0]
    cases = [dict(repetition_penalty=1.5), dict(presence_penalty=-0.5, frequency_penalty=1.0),
             dict(min_tokens=6, stop_token_ids=(free[2],)), dict(repetition_penalty=1.3, min_p=0.2)]
    with asyncio.Runner() as runner:
        engine = VLLMLaneEngine(full, ExactLaneConfig(engine="vllm"), draft_path=fast)
        try:
            async def vllm(request: EngineRequest) -> tuple[list[int], list, dict | None]:
                tokens, lps, drafts = [], [], None
                async for o in engine.generate(request):
                    tokens += o.token_ids
                    lps += o.logprobs or []
                    drafts = o.speculative or drafts
                return tokens, lps, drafts

            for i, case in enumerate(cases):
                request = EngineRequest(f"c{i}", ids, 24, temperature=0, ignore_eos="stop_token_ids" not in case, **case)
                theirs, _, drafts = runner.run(vllm(request))
                assert theirs != free and spec.generate([ids], request.sampling())[0] == theirs, case
                assert drafts is not None and drafts["drafted"] > 0, case  # drafts were verified
            for name, fields in (("logit_bias", dict(temperature=0, logit_bias=((7, 3.0),))),
                                 ("min_p", dict(temperature=0.8, min_p=0.1))):
                with pytest.raises(UnsupportedParameter, match=f"^{name}: not served by the exact lane on vLLM"):
                    engine.check_request(EngineRequest("x", ids, 4, **fields))
            request = EngineRequest("lp", ids, 16, temperature=0, ignore_eos=True, logprobs=3, repetition_penalty=1.3)
            tokens, theirs, _ = runner.run(vllm(request))
            ours_tokens, ours = logprobs_run(spec, "lp", ids, request.sampling())
            assert ours_tokens == tokens
            for (a, a_ids, a_lps), (b, b_ids, b_lps) in zip(ours, theirs, strict=True):
                assert abs(a - b) < 1e-3 and a_ids == b_ids
                assert max(abs(x - y) for x, y in zip(a_lps, b_lps, strict=True)) < 1e-3
        finally:
            engine.shutdown()
