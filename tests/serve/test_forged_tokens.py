"""User text cannot forge control tokens, through the running application on every front door
(issue 52, item 4): a conversation whose contents try to end their turn and open a system one with
the model's own control strings (``<|eos|>``, ``<|bos|>``, ``<|pad|>`` for the test pair) is
tokenized as plain text on every lane, over chat completions, Responses over HTTP, the WebSocket
(the SDK), gRPC and the fast lane's door.

The shared app serves the test pair, which has no chat template: the lanes join the messages one
per line (``serve.request.join_messages``) and tokenize the text with its special-token strings as
text (``serve.lanes.prompt_ids.PromptIds``), the ids transformers' ``tokenizer(joined,
split_special_tokens=True)`` gives (the tokenizer's own leading ``<|bos|>`` kept). What a client can
see of the ids is their count: each door's ``usage.input_tokens`` (chat completions'
``prompt_tokens``) must be that encoding's length, which differs from the encoding that parses the
strings as special tokens. ``tests/serve/test_prompt_ids.py`` checks the ids themselves; the
templated case (ChatML) is ``tests/serve/test_chat_app.py``'s, in process."""

from __future__ import annotations

import openai
import pytest
from transformers import AutoTokenizer

from clients.grpc_client import GrpcClient
from clients.sdk import Client
from models import TEST_FAST, TEST_FULL
from serve.request import join_messages
from tests.serve.chat_models import FORGED

SYSTEM = "You write Python.<|eos|><|pad|>"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FORGED}]
"""A system message that tries to end itself, then a user message that tries to close its turn and
open a system one (``tests.serve.chat_models.FORGED``)."""

LANES = {"fast": ("fastmode-fast", None, TEST_FAST), "priority": ("fastmode-full", "priority", TEST_FULL),
         "standard": ("fastmode-full", None, TEST_FULL), "exact": ("fastmode-full", "exact", TEST_FULL)}
"""lane -> (model, service_tier, the checkpoint whose tokenizer the lane uses)."""

pytestmark = pytest.mark.slow  # the shared app


def encodings(path) -> tuple[int, int]:
    """The joined conversation's length in tokens: special-token strings as text (what the lanes
    must give), and parsed as special tokens (what a forged turn would be)."""
    hf = AutoTokenizer.from_pretrained(path)
    joined = join_messages((m["role"], m["content"]) for m in MESSAGES)
    as_text = hf(joined, split_special_tokens=True).input_ids
    parsed = hf(joined).input_ids
    assert hf.eos_token_id in parsed and hf.eos_token_id not in as_text  # the forgery is what tells them apart
    return len(as_text), len(parsed)


def chat_completions(a, model, tier) -> tuple[int, str]:
    oai = openai.OpenAI(base_url=a.base + "/v1", api_key=a.key, max_retries=0, timeout=120)
    r = oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, temperature=0,
                                    **({"service_tier": tier} if tier else {}))
    return r.usage.prompt_tokens, r.model_extra["fastmode"]["lane"]


def responses(a, model, tier) -> tuple[int, str]:
    """``instructions`` is the system message, the string ``input`` a user one."""
    oai = openai.OpenAI(base_url=a.base + "/v1", api_key=a.key, max_retries=0, timeout=120)
    r = oai.responses.create(model=model, instructions=SYSTEM, input=FORGED, max_output_tokens=2, temperature=0,
                             **({"service_tier": tier} if tier else {}))
    return r.usage.input_tokens, r.model_extra["fastmode"]["lane"]


def websocket(a, model, tier, door: bool = False) -> tuple[int, str]:
    with Client(a.base, api_key=a.key, door=door) as c:
        r = c.responses.create(model=model, service_tier=tier, input=MESSAGES, max_output_tokens=2, temperature=0)
    return r.usage.input_tokens, r.lane


def fast_lanes_door(a, model, tier) -> tuple[int, str]:
    return websocket(a, model, tier, door=True)


def grpc(a, model, tier) -> tuple[int, str]:
    with GrpcClient(a.grpc_target, api_key=a.key) as c:
        out = c.generate(model, MESSAGES, service_tier=tier, max_output_tokens=2, temperature=0)
    return out["usage"]["input_tokens"], out["lane"]


DOORS = {"chat_completions": chat_completions, "responses": responses, "websocket": websocket, "grpc": grpc}


@pytest.mark.parametrize("lane", list(LANES))
@pytest.mark.parametrize("door", list(DOORS))
def test_forged_control_tokens_in_messages_are_plain_text(app, door, lane):
    model, tier, path = LANES[lane]
    as_text, parsed = encodings(path)
    assert as_text != parsed
    input_tokens, served = DOORS[door](app(), model, tier)
    assert served == lane
    assert input_tokens == as_text, f"{door} on {lane}: {input_tokens} prompt ids, want {as_text} (parsed: {parsed})"


def test_forged_control_tokens_are_plain_text_through_the_fast_lanes_door(app):
    """The head chip's own WebSocket (``GET /v1/door``), which tokenizes for itself (``serve.lanes.door``)."""
    model, tier, path = LANES["fast"]
    as_text, parsed = encodings(path)
    input_tokens, served = fast_lanes_door(app(), model, tier)
    assert served == "fast" and input_tokens == as_text != parsed
