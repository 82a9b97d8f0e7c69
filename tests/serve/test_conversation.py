"""Multi-turn (``previous_response_id``): the kept conversations, the router's join, and on the
running app, ten turns per lane equal to transformers' greedy output on the whole history and to
a full re-send of it, with the history's keys and values reused."""

from __future__ import annotations

import asyncio
import json

import pytest

from serve.conversation import PreviousResponseNotFound, ResponseStore, Turn, as_messages, find, to_input
from tests.serve.test_router import LaneHandle, router_over

TURNS = 10
TOKENS = 8


def turn(rid: str, *messages: tuple[str, str], lane: str = "fast") -> Turn:
    return Turn(rid, tuple(messages), lane, None)


def test_the_store_keeps_the_newest_within_its_bounds():
    store = ResponseStore(max_responses=2, max_bytes=100)
    for rid in ("a", "b", "c"):
        store.put(turn(rid, ("user", rid * 10)))
    assert "a" not in store and store.get("b") and store.get("c") and len(store) == 2  # oldest out first
    store.put(turn("d", ("user", "x" * 90)))  # 94 bytes: b and c (14 each) must go
    assert [r for r in "bcd" if r in store] == ["d"] and store.nbytes == 94
    store.put(turn("e", ("user", "x" * 200)))  # larger than the whole store: not kept
    assert "e" not in store and "d" in store
    store.put(turn("d", ("user", "short")))  # the same id again: replaced, bytes recounted
    assert store.nbytes == len("user") + len("short")
    assert len(ResponseStore(0, 100)) == 0


def test_find_looks_in_each_store_and_names_what_to_resend():
    own, shared = ResponseStore(4, 1000), ResponseStore(4, 1000)
    shared.put(turn("s", ("user", "hi")))
    own.put(turn("o", ("user", "yo")))
    assert find("o", own, shared).id == "o" and find("s", None, own, shared).id == "s"
    with pytest.raises(PreviousResponseNotFound, match="re-send the whole conversation") as e:
        find("nope", own, shared)
    assert e.value.code == "previous_response_not_found" and e.value.status == 400


def test_input_becomes_messages_and_back():
    assert as_messages("x = 1") == (("user", "x = 1"),)
    assert as_messages([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]) == (
        ("system", "s"), ("user", "u"))
    assert to_input((("user", "a"), ("assistant", "b"))) == [{"role": "user", "content": "a"},
                                                             {"role": "assistant", "content": "b"}]


class Recording(LaneHandle):
    """A lane that records the prompt of every request it gets: the text a model without a chat
    template (the shipped ones) makes of it (a conversation joined, ``ChatPrompt.joined``)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.prompts: list[str] = []

    def remote(self, request):
        self.prompts.append(request.prompt if isinstance(request.prompt, str) else request.prompt.joined())
        return super().remote(request)


def recording_router(config: dict | None = None):
    from serve.config import load_config
    from serve.router import Router

    lanes = {name: Recording(name) for name in ("fast", "priority", "standard", "exact")}
    return Router(load_config(config or {}), **lanes), lanes


async def run(router, history=None, owner="", **body) -> list[dict]:
    body = {"model": "fastmode-fast", "input": "x = 1", **body}
    return [e async for e in router.stream(body, history, owner)]


def test_a_turn_continues_the_kept_conversation_as_a_full_resend_would():
    router, lanes = recording_router()
    history = ResponseStore(8, 10_000)

    async def main():
        await run(router, history, id="r1", input="def f():")
        await run(router, history, id="r2", input="def g():", previous_response_id="r1")
        await run(router, history, id="r3", input=[{"role": "user", "content": "def h():"}],
                  previous_response_id="r2")
        full = to_input(history.get("r2").messages) + [{"role": "user", "content": "def h():"}]
        await run(router, None, id="r4", input=full)

    asyncio.run(main())
    out = "xxx"  # what the scripted lane answers every time
    assert lanes["fast"].prompts == ["def f():", f"def f():\n{out}\ndef g():", f"def f():\n{out}\ndef g():\n{out}\ndef h():",
                                     f"def f():\n{out}\ndef g():\n{out}\ndef h():"]
    assert history.get("r3").messages[-1] == ("assistant", out) and "r4" not in history


@pytest.mark.parametrize("kept, error", [("r1", None), ("other", "previous_response_not_found")])
def test_only_completed_responses_of_this_connection_or_stored_ones_continue(kept, error):
    router, _ = recording_router()
    mine, theirs = ResponseStore(8, 10_000), ResponseStore(8, 10_000)

    async def main():
        await run(router, theirs, id="other", input="a")  # another connection's, not stored
        await run(router, theirs, id="shared", input="b", store=True)  # stored: any connection's
        await run(router, mine, id="r1", input="c")
        events = await run(router, mine, id="next", input="d", previous_response_id=kept)
        shared = await run(router, mine, id="next2", input="e", previous_response_id="shared")
        return events, shared

    events, shared = asyncio.run(main())
    assert shared[-1]["type"] == "done"
    if error is None:
        assert events[-1]["type"] == "done"
    else:
        assert [e["type"] for e in events] == ["error"] and events[0]["code"] == error
        assert "re-send the whole conversation" in events[0]["message"]


def test_a_stored_response_continues_only_with_the_key_that_created_it():
    from serve.auth import key_of, owner_of

    keys = frozenset({"key-a", "key-b"})
    a, b = owner_of(key_of(keys, "Bearer key-a")), owner_of(key_of(keys, "Bearer key-b"))
    assert a and b and a != b and "key-a" not in a and owner_of(key_of(frozenset(), None)) == ""
    router, lanes = recording_router()

    async def main():
        await run(router, None, a, id="s", input="secret = 1", store=True)
        theirs = await run(router, None, b, id="t", input="x", previous_response_id="s")
        no_key = await run(router, None, "", id="u", input="x", previous_response_id="s")
        mine = await run(router, None, a, id="m", input="y", previous_response_id="s")
        return theirs, no_key, mine

    theirs, no_key, mine = asyncio.run(main())
    # Another key is told what an unknown id is told: nothing says the response exists.
    for events in (theirs, no_key):
        assert [e["type"] for e in events] == ["error"] and events[0]["code"] == "previous_response_not_found"
    assert mine[-1]["type"] == "done" and lanes["fast"].prompts[-1].startswith("secret = 1")
    assert not any(p.startswith("secret") for p in lanes["fast"].prompts[1:-1])
    store = ResponseStore(4, 1000)
    store.put(Turn("r", (("user", "u"),), "fast", None, a))
    assert store.get("r", a) and store.get("r", b) is None and store.get("r") is None


def test_a_response_still_streaming_or_failed_is_not_kept():
    router, lanes = recording_router()
    history = ResponseStore(8, 10_000)

    async def main():
        stream = router.stream({"model": "fastmode-fast", "input": "a", "id": "live"}, history)
        assert (await stream.__anext__())["type"] == "created"
        during = await run(router, history, id="n1", input="b", previous_response_id="live")
        stream.cancel()
        await asyncio.sleep(0.05)
        after = await run(router, history, id="n2", input="b", previous_response_id="live")
        bad = await run(router, history, id="bad", model="nope")
        return during, after, bad

    during, after, bad = asyncio.run(main())
    assert during[0]["code"] == after[0]["code"] == "previous_response_not_found"
    assert bad[0]["code"] == "unknown_model" and "bad" not in history and "live" not in history


def test_the_next_turn_prefers_the_replica_that_holds_the_prefix():
    from serve.lanes.lane_links import LaneLinks, LinkServer
    from tests.serve.test_lane_links import Handle, Scripted

    async def main():
        a, b = Scripted(n=10_000, every_s=0.001), Scripted(n=10_000, every_s=0.001)
        links = LaneLinks(Handle(LinkServer(a.generate), LinkServer(b.generate)), replicas=2)
        first, s1 = await links.open({"id": 1}, set())
        # the other replica is less busy, but the conversation's replica is preferred
        again, s2 = await links.open({"id": 2}, set(), prefer=first)
        other, s3 = await links.open({"id": 3}, {first}, prefer=first)  # a retry goes elsewhere
        for s in (s1, s2, s3):
            s.cancel()
        links.close()
        return first, again, other

    first, again, other = asyncio.run(main())
    assert again == first and other != first


# -- on the running app ------------------------------------------------------------------------
LANE_REQUESTS = {"fast": {"model": "fastmode-fast"}, "standard": {"model": "fastmode-full"},
                 "priority": {"model": "fastmode-full", "service_tier": "priority"},
                 "exact": {"model": "fastmode-full", "service_tier": "exact"}}
INPUTS = ["def parse(line):", "    parts = line.split(',')", "def total(rows):", "    return sum(",
          "class Point:", "    def __init__(self, x, y):", "import os", "def main():", "    args = ",
          "if __name__ == '__main__':"]


@pytest.fixture(scope="module")
def references():
    """transformers' greedy continuation of a prompt by each shipped model (cached)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from models import TEST_FAST, TEST_FULL
    from tests.conftest import shipped

    tok = AutoTokenizer.from_pretrained(shipped(TEST_FULL))
    models = {name: LlamaForCausalLM.from_pretrained(shipped(p), dtype=torch.float32).eval()
              for name, p in (("fast", TEST_FAST), ("full", TEST_FULL))}

    @torch.no_grad()
    def greedy(model: str, prompt: str) -> tuple[str, int]:
        ids = tok(prompt, return_tensors="pt").input_ids
        out = models[model].generate(ids, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False,
                                     pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
        return tok.decode(out, skip_special_tokens=True), ids.shape[1]

    return greedy


def resent_text(conversation: list[dict[str, str]]) -> str:
    """The protocol's join (docs/protocol.md), written out here: a line break before each message but
    the first and an assistant message that starts with one."""
    text = conversation[0]["content"]
    for m in conversation[1:]:
        glued = m["role"] == "assistant" and m["content"].startswith("\n")
        text += m["content"] if glued else "\n" + m["content"]
    return text


@pytest.mark.slow
@pytest.mark.parametrize("lane", list(LANE_REQUESTS))
def test_ten_turns_equal_transformers_and_a_full_resend(app, references, lane):
    from clients.sdk import Client

    a = app()
    url = a.base.replace("http", "ws", 1)
    params = {**LANE_REQUESTS[lane], "temperature": 0, "max_output_tokens": TOKENS, "ignore_eos": True}
    conversation: list[dict[str, str]] = []
    cached, inputs = [], []
    with Client(url, api_key=a.key) as client, Client(url, api_key=a.key) as resend:
        previous = None
        for k, text in enumerate(INPUTS[:TURNS]):
            r = client.responses.create(**params, input=text, previous_response_id=previous)
            conversation.append({"role": "user", "content": text})
            full = resend.responses.create(**params, input=list(conversation))  # another connection
            want, n_input = references("fast" if lane == "fast" else "full", resent_text(conversation))
            assert r.lane == full.lane == lane and r.text == full.text == want, (k, r.text, full.text, want)
            assert r.usage.input_tokens == full.usage.input_tokens == n_input, k
            cached.append(r.usage.cached_tokens)
            inputs.append(n_input)
            conversation.append({"role": "assistant", "content": r.text})
            previous = r.id
    glued = [k for k in range(1, TURNS) if conversation[2 * k - 1]["content"].startswith("\n")]
    assert glued, "no output started with a line break: the join's other case is untested"
    if lane == "fast":  # the executor's prefix cache: every turn after the first reuses its history
        assert all(c > 0 for c in cached[1:]), cached
        # After an output that follows its prompt directly, the turn reuses more than that prompt:
        # the output's own keys and values from generation.
        assert all(cached[k] > inputs[k - 1] + 1 for k in glued), (glued, cached, inputs)
    elif lane in ("priority", "standard"):  # vLLM's sessions (serve/lanes/vllm_sessions.py): from the
        # second turn on a turn runs as a session's; after an output that follows its prompt, the next
        # turn continues that session, reusing its prompt and that output but the last token, to the
        # token, not only whole blocks.
        later = [k for k in glued if k >= 2]
        assert later and all(cached[k] >= inputs[k - 1] + 1 for k in later), (glued, cached, inputs)
    else:  # vLLM's automatic prefix caching reuses whole blocks of the history once there is one
        assert any(c > 0 for c in cached[1:]), cached


@pytest.mark.slow
def test_errors_and_a_stored_response_over_the_websocket_and_http(app):
    from websockets.sync.client import connect

    a = app()
    headers = {"Authorization": f"Bearer {a.key}"}
    base = {"type": "response.create", "model": "fastmode-fast", "temperature": 0, "max_output_tokens": 4}

    def until_end(ws, rid):
        while True:
            e = json.loads(ws.recv(timeout=60))
            if e.get("id") == rid and e["type"] in ("response.completed", "error", "response.cancelled"):
                return e

    with connect(a.ws_url, additional_headers=headers) as ws:
        ws.send(json.dumps({**base, "id": "a1", "input": "x = 1"}))
        assert until_end(ws, "a1")["type"] == "response.completed"
        ws.send(json.dumps({**base, "id": "s1", "input": "y = 2", "store": True}))
        assert until_end(ws, "s1")["type"] == "response.completed"
        ws.send(json.dumps({**base, "id": "bad", "input": "z", "previous_response_id": "missing"}))
        e = until_end(ws, "bad")
        assert e["code"] == "previous_response_not_found" and "re-send" in e["message"]
        ws.send(json.dumps({**base, "id": "typed", "input": "z", "previous_response_id": 7}))
        assert until_end(ws, "typed")["code"] == "invalid_request"
    with connect(a.ws_url, additional_headers=headers) as ws:  # a new connection
        ws.send(json.dumps({**base, "id": "b1", "input": "z", "previous_response_id": "a1"}))
        assert until_end(ws, "b1")["code"] == "previous_response_not_found"  # a1 was not stored
        ws.send(json.dumps({**base, "id": "b2", "input": "z = 3", "previous_response_id": "s1"}))
        done = until_end(ws, "b2")
        assert done["type"] == "response.completed" and done["usage"]["input_tokens_details"]["cached_tokens"] > 0
    r = a.client.post("/v1/generate", json={"model": "fastmode-fast", "input": "z = 3", "temperature": 0,
                                            "max_output_tokens": 4, "previous_response_id": "s1"})
    events = [json.loads(line) for line in r.text.splitlines()]
    assert events[-1]["type"] == "done" and events[0]["input_tokens"] == done["usage"]["input_tokens"]
    r = a.client.post("/v1/generate", json={"model": "fastmode-fast", "input": "z", "previous_response_id": "a1"})
    assert r.status_code == 400 and r.json()["code"] == "previous_response_not_found"
    import grpc

    from clients.grpc_client import GrpcClient, error_code

    with GrpcClient(a.grpc_target, api_key=a.key) as g:
        out = g.generate("fastmode-fast", "z = 3", temperature=0, max_output_tokens=4, previous_response_id="s1",
                         store=True)
        assert out["usage"]["input_tokens"] == done["usage"]["input_tokens"] and out["usage"]["cached_tokens"] > 0
        assert g.generate("fastmode-fast", "w", max_output_tokens=2, previous_response_id=out["id"])["text"] is not None
        with pytest.raises(grpc.RpcError) as e:
            g.generate("fastmode-fast", "z", previous_response_id="a1")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_code(e.value) == "previous_response_not_found"
    # Another key reads nothing of s1 on any front door: told what an unknown id is told.
    other = {"Authorization": "Bearer sk-other"}
    with connect(a.ws_url, additional_headers=other) as ws:
        ws.send(json.dumps({**base, "id": "o1", "input": "z", "previous_response_id": "s1"}))
        assert until_end(ws, "o1")["code"] == "previous_response_not_found"
    r = a.client.post("/v1/responses", headers=other, json={"model": "fastmode-fast", "input": "z",
                                                            "max_output_tokens": 2, "previous_response_id": "s1"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"
    with GrpcClient(a.grpc_target, api_key="sk-other") as g, pytest.raises(grpc.RpcError) as e:
        g.generate("fastmode-fast", "z", max_output_tokens=2, previous_response_id="s1")
    assert error_code(e.value) == "previous_response_not_found"
