"""The router: explicit choices, ``auto`` by difficulty, clear errors, and the priority lane's cap."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.serve.conftest import text_of

EASY = "import os\n" * 12
HARD = "qZ7#kP!x 9@Lr&vW2^ mB4*tY8 (Jd0%eN6)"


@pytest.mark.slow
@pytest.mark.parametrize("model,tier,lane", [
    ("fastmode-fast", None, "fast"), ("fastmode-fast", "priority", "fast"),
    ("fastmode-full", None, "standard"), ("fastmode-full", "default", "standard"),
    ("fastmode-full", "auto", "standard"), ("fastmode-full", "priority", "priority"),
    ("fastmode-full", "exact", "exact"),
])
def test_explicit_choices_are_honored(app, model, tier, lane):
    status, events = app().generate(model=model, service_tier=tier, input="x = 1\n", max_output_tokens=4,
                                    temperature=0)
    assert status == 200, events
    assert (events[0]["lane"], events[-1]["lane"], events[-1]["model"]) == (lane, lane, model)
    assert events[0]["route"] == {"by": "model"}


@pytest.mark.slow
def test_a_sampled_exact_request_runs_on_the_exact_lane_seeded(app):
    # fastmode's speculative engine (the exact lane's default) samples by the rejection rule: a sampled
    # request stays on exact, and its seed makes it reproducible (k is fixed).
    def text(seed: int) -> str:
        status, events = app().generate(model="fastmode-full", service_tier="exact", input="def f(x):\n",
                                        max_output_tokens=16, temperature=1.0, seed=seed, ignore_eos=True)
        assert status == 200, events
        assert events[0]["lane"] == events[-1]["lane"] == "exact" and "sampled_on" not in events[0]["route"]
        assert events[-1]["speculative"]["verify_steps"] >= 1
        return "".join(e["text"] for e in events if e["type"] == "delta")

    assert text(1) == text(1) != text(2)


@pytest.mark.slow
def test_auto_routes_by_difficulty_hard_to_fast_by_default(app):
    routes = {}
    for name, prompt in (("easy", EASY), ("hard", HARD)):
        status, events = app().generate(model="auto", input=prompt, max_output_tokens=4)
        assert status == 200, events
        routes[name] = events[0]
    easy, hard = routes["easy"], routes["hard"]
    assert easy["route"]["by"] == hard["route"]["by"] == "auto"
    assert easy["route"]["difficulty"] <= easy["route"]["threshold"] < hard["route"]["difficulty"]
    assert easy["route"]["fast_when"] == "hard"  # the test pair's policy (tests/conftest.py TEST_PAIR_ROUTER)
    # the rest: router.auto_full_tier, the test pair's exact (standard if the exact lane were full)
    assert (easy["lane"], easy["model"]) == ("exact", "fastmode-full") and "spilled_from" not in easy["route"]
    assert (hard["lane"], hard["model"]) == ("fast", "fastmode-fast")
    status, events = app().generate(model="auto", service_tier="priority", input=EASY, max_output_tokens=4)
    assert events[0]["lane"] == "priority"


@pytest.mark.slow
@pytest.mark.parametrize("body,status,code,says", [
    ({"model": "gpt-5", "input": "x"}, 404, "unknown_model", "fastmode-full"),
    ({"model": "fastmode-full", "service_tier": "flex", "input": "x"}, 400, "unknown_service_tier", "priority"),
    ({"model": "fastmode-fast", "input": "x", "temperature": -1}, 400, "invalid_request", "temperature"),
    ({"model": "fastmode-fast", "input": "x", "top_p": "high"}, 400, "invalid_request", "top_p"),
    ({"model": "fastmode-fast", "input": "x", "colour": 1}, 400, "unsupported_parameter", "colour"),
    ({"input": "x"}, 400, "invalid_request", "model"),
    ({"model": "fastmode-fast", "input": ""}, 400, "invalid_request", "empty"),
    ({"model": "fastmode-full", "input": "x", "max_output_tokens": 100000}, 400, "prompt_too_long", "512"),
    ({"model": "fastmode-fast", "input": "x", "max_output_tokens": 100000}, 400, "prompt_too_long", "512"),
])
def test_bad_requests_get_clear_typed_errors(app, body, status, code, says):
    got, events = app().generate(**body)
    assert (got, events[0]["type"], events[0]["code"]) == (status, "error", code), events
    assert says in events[0]["message"]
    ok, events = app().generate(model="fastmode-fast", input="x = 1\n", max_output_tokens=2)
    assert ok == 200 and events[-1]["type"] == "done"  # and the next request is served


@pytest.mark.slow
def test_priority_cap_rejects_or_spills_the_third_stream(app):
    a = app()
    long = {"model": "fastmode-full", "service_tier": "priority", "input": "class Parser:\n",
            "max_output_tokens": 480, "ignore_eos": True, "temperature": 0}
    with a.stream(**long) as (s1, first), a.stream(**long) as (s2, second):
        assert (s1, s2) == (200, 200)
        for events in (first, second):  # both admitted and decoding
            assert next(events)["lane"] == "priority"
            assert next(events)["type"] == "delta"
        with a.paused("priority"):  # neither can end and give its slot back meanwhile
            status, events = a.generate(**long)
            assert status == 429, events
            assert events[0]["code"] == "overloaded" and events[0]["retry_after"] > 0
            status, events = a.generate(**(long | {"allow_spill": True, "max_output_tokens": 8}))
        assert status == 200, events
        assert events[0]["lane"] == events[-1]["lane"] == "standard"
        assert events[0]["route"]["spilled_from"] == "priority"
        assert events[-1]["cost_units"] == pytest.approx(events[-1]["usage"]["total_tokens"] / 1000)
    deadline = time.monotonic() + 30  # the gateway notices the closed streams, the lane frees them
    while (stats := a.lane_stats("priority"))["running"] or stats["in_flight"]:
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    status, events = a.generate(**(long | {"max_output_tokens": 4}))  # room again once they are gone
    assert status == 200 and events[-1]["lane"] == "priority", events
    assert text_of(events)


# --- in process: the router library over scripted lane handles ----------------------------------

class LaneStream:
    """What a lane handle's ``options(stream=True).generate.remote`` returns."""

    def __init__(self, events: list, log: list) -> None:
        self.events, self.log = iter(events), log

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(0.001)
        event = next(self.events, None)
        if event is None:
            raise StopAsyncIteration
        if isinstance(event, Exception):
            raise event
        return dict(event)

    def cancel(self) -> None:
        self.log.append("cancelled")


class LaneHandle:
    """A lane with ``room`` streams left: each one more is refused with ``Overloaded`` (wrapped as
    Ray wraps a replica's exception), as ``serve.lanes.lane.Lane`` does."""

    def __init__(self, name: str, room: int = 100, deltas: int = 3) -> None:
        self.name, self.room, self.deltas = name, room, deltas
        self.calls, self.logs, self.requests = 0, [], []

    def options(self, stream: bool):
        assert stream
        return self

    @property
    def generate(self):
        return self

    def remote(self, request: dict) -> LaneStream:
        from ray.exceptions import RayTaskError

        from serve.errors import Overloaded

        self.calls += 1
        self.requests.append(request)
        self.logs.append([])
        if self.room <= 0:
            cause = Overloaded(f"the {self.name} lane's batch is full (2 sequences)", retry_after=1.5)
            return LaneStream([RayTaskError("generate", "traceback", cause)], self.logs[-1])
        self.room -= 1
        events = ([{"type": "accepted", "input_tokens": 3}]
                  + [{"type": "delta", "seq": i, "text": "x", "tokens": 1} for i in range(self.deltas)]
                  + [{"type": "done", "lane": self.name, "model": "m", "finish_reason": "length",
                      "usage": {"input_tokens": 3, "output_tokens": self.deltas, "total_tokens": 3 + self.deltas},
                      "timing": {"ttft_s": 0.001, "decode_tokens_per_s": None, "total_s": 0.01}, "cost_units": 0.0}])
        return LaneStream(events, self.logs[-1])


def router_over(config: dict | None = None, **rooms: int):
    from serve.config import load_config
    from serve.router import Router

    lanes = {name: LaneHandle(name, rooms.get(name, 100)) for name in ("fast", "priority", "standard", "exact")}
    return Router(load_config(config or {}), **lanes), lanes


async def events_of(router, **body) -> list[dict]:
    return [e async for e in router.stream({"model": "fastmode-full", "input": "x = 1\n", **body})]


def test_the_router_streams_from_the_lane_it_picks():
    router, lanes = router_over()
    events = asyncio.run(events_of(router, service_tier="priority"))
    assert [e["type"] for e in events] == ["created", "delta", "delta", "delta", "done"]
    assert events[0]["lane"] == events[-1]["lane"] == "priority" and events[-1]["route"] == {"by": "model"}
    assert all(e["id"] == events[0]["id"] for e in events) and events[-1]["timing"]["engine_ttft_s"] == 0.001
    assert (lanes["priority"].calls, lanes["standard"].calls, lanes["fast"].calls) == (1, 0, 0)


def test_a_lane_refusal_is_overloaded_or_spills_to_standard():
    router, lanes = router_over(priority=0)
    events = asyncio.run(events_of(router, service_tier="priority"))
    assert [(e["type"], e["code"], e["status"], e["retry_after"]) for e in events] == [
        ("error", "overloaded", 429, 1.5)]
    assert "allow_spill" in events[0]["message"] and lanes["priority"].logs == [["cancelled"]]
    events = asyncio.run(events_of(router, service_tier="priority", allow_spill=True))
    assert events[0]["lane"] == events[-1]["lane"] == "standard" and events[-1]["type"] == "done"
    assert events[0]["route"] == {"by": "model", "spilled_from": "priority"}
    router, lanes = router_over(priority=0, standard=0)
    events = asyncio.run(events_of(router, service_tier="priority", allow_spill=True))
    assert events[0]["code"] == "overloaded" and "priority and standard lanes are full" in events[0]["message"]


def test_a_refused_exact_request_spills_to_standard_when_allowed():  # greedy: sampled ones run on priority
    router, lanes = router_over(exact=0)
    events = asyncio.run(events_of(router, service_tier="exact", temperature=0))
    assert events[0]["code"] == "overloaded" and "allow_spill" in events[0]["message"]
    events = asyncio.run(events_of(router, service_tier="exact", allow_spill=True, temperature=0))
    assert events[0]["lane"] == events[-1]["lane"] == "standard" and events[-1]["type"] == "done"
    assert events[0]["route"] == {"by": "model", "spilled_from": "exact"}
    router, lanes = router_over(exact=0, standard=0)
    events = asyncio.run(events_of(router, service_tier="exact", allow_spill=True, temperature=0))
    assert "exact and standard lanes are full" in events[0]["message"]


@pytest.mark.parametrize("full_tier,named,lane", [
    ("exact", None, "exact"), ("exact", "auto", "exact"), ("priority", None, "priority"),
    ("default", None, "standard"), ("exact", "default", "standard"), ("default", "exact", "exact"),
])
def test_auto_sends_hard_prompts_to_its_full_tier_unless_the_request_names_one(full_tier, named, lane):
    router, lanes = router_over({"router": {"auto_full_tier": full_tier, "auto_threshold": 0.001,
                                            "auto_fast_when": "easy"}})
    events = asyncio.run(events_of(router, model="auto", service_tier=named, temperature=0))
    assert events[0]["lane"] == lane and events[0]["route"]["by"] == "auto", events[0]
    assert lanes[lane].calls == 1 and sum(h.calls for h in lanes.values()) == 1


@pytest.mark.parametrize("full_tier,named", [("exact", None), ("default", "priority"), ("default", "exact")])
def test_auto_spills_to_standard_when_its_full_tier_is_full(full_tier, named):
    # auto chose the lane, so it spills on its own (no allow_spill): standard is the same model, cheaper.
    config = {"router": {"auto_full_tier": full_tier, "auto_threshold": 0.001, "auto_fast_when": "easy"}}
    router, lanes = router_over(config, priority=0, exact=0)
    events = asyncio.run(events_of(router, model="auto", service_tier=named, temperature=0))
    lane = named or full_tier
    assert events[0]["lane"] == events[-1]["lane"] == "standard" and events[-1]["type"] == "done", events
    assert events[0]["route"]["by"] == "auto" and events[0]["route"]["spilled_from"] == lane
    assert lanes[lane].calls == 1 and lanes[lane].logs == [["cancelled"]] and lanes["standard"].calls == 1
    router, lanes = router_over(config, priority=0, exact=0, standard=0)
    events = asyncio.run(events_of(router, model="auto", service_tier=named, temperature=0))
    assert events[0]["code"] == "overloaded" and f"{lane} and standard lanes are full" in events[0]["message"]


def test_auto_does_not_spill_from_the_fast_lane():
    # the fast lane's model is another model: a full fast lane is overloaded, not served by the full one.
    router, lanes = router_over({"router": {"auto_threshold": 0.001, "auto_fast_when": "hard"}}, fast=0)
    events = asyncio.run(events_of(router, model="auto", input="qZ7#kP!x 9@Lr&vW2^", temperature=0))
    assert events[0]["code"] == "overloaded" and lanes["fast"].calls == 1 and lanes["standard"].calls == 0
    assert "allow_spill" not in events[0]["message"]  # it would not help


@pytest.mark.parametrize("full_tier, lane", [(None, "standard"), ("exact", "exact")])
def test_auto_sends_the_rest_to_its_full_tier_standard_by_default(full_tier, lane):
    from serve.config import load_config

    assert load_config({}).router.auto_full_tier == "default"  # the shipped pair's policy (decision 028)
    router_config = {"auto_threshold": 100.0, "auto_fast_when": "hard"}  # nothing that hard: all to full
    router, lanes = router_over({"router": router_config | ({"auto_full_tier": full_tier} if full_tier else {})})
    events = asyncio.run(events_of(router, model="auto", temperature=0))
    assert events[0]["lane"] == lane and lanes[lane].calls == 1


@pytest.mark.parametrize("request_fields", [{"service_tier": "exact"}, {"model": "auto"}])
def test_sampled_exact_requests_go_to_priority_on_vllms_engine_and_greedy_ones_stay(request_fields):
    # vLLM's draft-model speculative decoding does not keep the full model's distribution when it
    # samples on vLLM's CPU build (docs/lanes.md): with the exact lane on vLLM, the exact tier's sampled
    # requests decode without drafts, on priority.
    router, lanes = router_over({"router": {"auto_full_tier": "exact", "auto_threshold": 0.001,
                                            "auto_fast_when": "easy"}, "lanes": {"exact": {"engine": "vllm"}}})
    sampled = asyncio.run(events_of(router, **request_fields, temperature=0.5))
    assert sampled[0]["lane"] == sampled[-1]["lane"] == "priority" and sampled[0]["route"]["sampled_on"] == "priority"
    greedy = asyncio.run(events_of(router, **request_fields, temperature=0))
    assert greedy[0]["lane"] == "exact" and "sampled_on" not in greedy[0]["route"]
    assert lanes["priority"].calls == lanes["exact"].calls == 1


def test_sampled_exact_requests_stay_on_exact_on_fastmodes_engine():
    router, lanes = router_over()
    sampled = asyncio.run(events_of(router, service_tier="exact", temperature=0.5))
    assert sampled[0]["lane"] == "exact" and "sampled_on" not in sampled[0]["route"]
    assert lanes["exact"].calls == 1 and lanes["priority"].calls == 0


def test_a_refused_stream_is_offered_once_per_replica():
    router, lanes = router_over({"lanes": {"priority": {"replicas": 3}}}, priority=0)
    events = asyncio.run(events_of(router, service_tier="priority"))
    assert events[0]["code"] == "overloaded" and lanes["priority"].calls == 3


def test_cancelling_a_stream_cancels_the_lanes_stream_and_frees_the_count():
    router, lanes = router_over()

    async def main():
        stream = router.stream({"model": "fastmode-fast", "input": "x = 1\n"})
        assert (await stream.__anext__())["type"] == "created"
        assert (await stream.__anext__())["type"] == "delta"
        assert router.in_flight["fast"] == 1
        stream.cancel()
        await asyncio.sleep(0.05)
        return stream

    stream = asyncio.run(main())
    assert lanes["fast"].logs == [["cancelled"]] and router.in_flight["fast"] == 0
    stream.cancel()  # twice: nothing more


def test_bad_requests_fail_before_any_lane_is_called():
    router, lanes = router_over()
    events = asyncio.run(events_of(router, model="gpt-5"))
    assert events[0]["code"] == "unknown_model" and sum(h.calls for h in lanes.values()) == 0


def test_each_request_reaches_its_lane_under_an_id_of_its_own():
    """Two connections may both name a request "r1": the engines key their sequences by the lane's
    request id, so two such requests in flight at once collided (one of them never ended:
    ``test_websocket.py::test_the_same_id_on_two_connections_is_two_requests``)."""
    router, lanes = router_over()

    async def main():
        return await asyncio.gather(*(events_of(router, id="r1") for _ in range(2)))

    for events in asyncio.run(main()):
        assert {e["id"] for e in events} == {"r1"}  # the client's id on every event
    ids = [r.request_id for r in lanes["standard"].requests]
    assert len(set(ids)) == 2 and all(i.startswith("r1#") for i in ids)


# --- what the request span holds: no text unless telemetry.record_content ------------------------

SECRET_PROMPT = "def launch_codes_7f3a():\n"


def traced(monkeypatch, config: dict | None, *bodies: dict) -> list:
    """The finished spans of ``bodies`` streamed through a router over scripted lanes."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from serve import telemetry

    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(telemetry, "tracer", lambda: provider.get_tracer(telemetry.TRACER_NAME))
    router, _ = router_over(config)
    for body in bodies:
        asyncio.run(events_of(router, **body))
    return list(exporter.get_finished_spans())


def span_text(span) -> str:
    return repr(dict(span.attributes)) + repr(span.status.description) + repr(span.name) + repr(span.events)


BODIES = [{"model": "fastmode-fast", "input": SECRET_PROMPT},
          {"model": "fastmode-fast", "input": [{"role": "user", "content": SECRET_PROMPT}]},
          # Refused: the validation error quotes the offending input (the client sees it; spans must not).
          {"model": "fastmode-fast", "input": [{"role": "wizard", "content": SECRET_PROMPT}]},
          {"model": "fastmode-fast", "input": SECRET_PROMPT, "stop": [SECRET_PROMPT] * 5}]


def test_spans_hold_no_prompt_output_or_error_message_by_default(monkeypatch):
    spans = traced(monkeypatch, None, *BODIES)
    assert len(spans) == len(BODIES)
    for span in spans:
        text = span_text(span)
        assert "launch_codes" not in text and "xxx" not in text, text  # the lanes' output is "x" x 3
    ok, chat, bad_role, bad_stop = spans
    assert ok.attributes["gen_ai.usage.output_tokens"] == 3 and ok.attributes["fastmode.lane"] == "fast"
    for refused in (bad_role, bad_stop):
        assert refused.attributes["error.type"] == refused.status.description == "invalid_request"


def test_record_content_puts_prompts_outputs_and_error_messages_on_spans(monkeypatch):
    import json

    spans = traced(monkeypatch, {"telemetry": {"record_content": True}}, *BODIES)
    ok, chat, bad_role, bad_stop = spans
    for span in (ok, chat):
        assert json.loads(span.attributes["gen_ai.input.messages"]) == [
            {"role": "user", "parts": [{"type": "text", "content": SECRET_PROMPT}]}]
        assert json.loads(span.attributes["gen_ai.output.messages"]) == [
            {"role": "assistant", "parts": [{"type": "text", "content": "xxx"}], "finish_reason": "length"}]
    assert "launch_codes" in bad_role.status.description  # the message, quoting the request
    assert "at most 4 stop strings" in bad_stop.status.description
