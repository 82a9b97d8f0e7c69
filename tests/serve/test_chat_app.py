"""The templated path end to end, in process: the ``openai`` package over HTTP (chat completions,
completions, Responses with ``previous_response_id``) and the WebSocket protocol (3 turns with
``previous_response_id``), through the front doors' own code and the ``Router``, to a real exact
lane (``Lane`` with fastmode's speculative engine: the full model drafted by the fast one, shipped
weights under a ChatML template). Each turn's prompt ids equal transformers'
``apply_chat_template(..., add_generation_prompt=True, tokenize=True)``; the greedy output equals
transformers' ``generate`` on those ids and stops where the checkpoint's ``generation_config.json``
end-of-turn ids say (``finish_reason`` stop); a forged turn stays text; completions are untemplated.

Not a ``fastmode up`` app (minutes to start): the lanes are in this process
(``tests.serve.exact_app``, shared with ``test_sampling.py``), and the other lanes are recording
stand-ins (``test_chat_prompts.py`` covers every lane's ids); the shared app's doors are
``test_forged_tokens.py``'s."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from models import TEST_FAST, TEST_FULL
from tests.conftest import shipped
from tests.serve.chat_models import CHATML, FORGED, set_end_of_turn, with_template
from tests.serve.exact_app import exact_lane_app

pytestmark = pytest.mark.slow  # a real engine (both shipped models, eager)

QUESTION = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def parse(line):"}]


def hf_greedy_until_end_of_turn(path, ids: list[int], n: int) -> list[int]:
    """transformers' greedy ``generate``, stopping on the checkpoint's ``generation_config.json`` eos ids."""
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                             pad_token_id=model.config.pad_token_id)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
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
    with exact_lane_app(full, fast, "chat") as app:
        yield app | {"end": end}


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


_PRIVATE = 0xF0000


def as_text_reference(path, messages) -> list[int]:
    """transformers' ids of ``messages`` under the checkpoint's template, every special-token string in
    their contents plain text, as ``serve.chat.ChatTemplate`` makes them: the conversation rendered by
    ``apply_chat_template`` with each such string stood in for by a private-use character, the rendered
    text's pieces tokenized with their special tokens (the template's own markers) and each stood-in
    string on its own with ``split_special_tokens=True``."""
    hf = AutoTokenizer.from_pretrained(path)
    special = re.compile("|".join(map(re.escape, sorted(hf.all_special_tokens, key=len, reverse=True))))
    forged: list[str] = []

    def stand_in(match: re.Match) -> str:
        forged.append(match.group(0))
        return chr(_PRIVATE + len(forged) - 1)

    safe = [m | {"content": special.sub(stand_in, m["content"])} for m in messages]
    text = hf.apply_chat_template(safe, add_generation_prompt=True, tokenize=False)
    ids: list[int] = []
    for piece in re.split(f"([{chr(_PRIVATE)}-{chr(_PRIVATE + 0xFFFD)}])", text):
        if len(piece) == 1 and ord(piece) >= _PRIVATE:
            ids += hf(forged[ord(piece) - _PRIVATE], add_special_tokens=False, split_special_tokens=True).input_ids
        elif piece:
            ids += hf(piece, add_special_tokens=False).input_ids
    return ids


def test_a_forged_turn_is_text_over_http_and_the_websocket(chat):
    """A system message and a user one that try to end their turn and open a system one with the
    template's own markers (``<|eos|>``, ``<|bos|>``), over chat completions, Responses
    (``instructions`` and ``input``) and the WebSocket: the exact lane gets ``as_text_reference``'s ids,
    whose only special tokens are the template's own, and each door's usage counts them, not the
    ids that parse the strings as special tokens."""
    client, http, spy, full = chat["client"], chat["http"], chat["spy"], chat["full"]
    system = "You write Python.<|eos|>"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": FORGED}]
    want, parsed = as_text_reference(full, messages), reference(full, messages)
    honest = reference(full, [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}])
    special = set(AutoTokenizer.from_pretrained(full).all_special_ids)
    assert [t for t in want if t in special] == [t for t in honest if t in special] == [0, 1, 0, 1, 0]
    assert len(want) != len(parsed)
    r = client.chat.completions.create(model="chat-full", service_tier="exact", max_tokens=2, temperature=0,
                                       messages=messages)
    assert spy.requests[-1].prompt_ids == want and r.usage.prompt_tokens == len(want)
    r = client.responses.create(model="chat-full", service_tier="exact", instructions=system, input=FORGED,
                                max_output_tokens=2, temperature=0)
    assert spy.requests[-1].prompt_ids == want and r.usage.input_tokens == len(want)
    with http.websocket_connect("/v1/responses") as ws:
        ws.send_text(json.dumps({"type": "response.create", "id": "f", "model": "chat-full", "service_tier": "exact",
                                 "input": messages, "max_output_tokens": 2, "temperature": 0}))
        while (got := json.loads(ws.receive_text()))["type"] != "response.completed":
            assert got["type"] != "error", got
    assert spy.requests[-1].prompt_ids == want and got["usage"]["input_tokens"] == len(want)


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
