"""The router: explicit choices, ``auto`` by difficulty, clear errors, and the priority lane's cap."""

from __future__ import annotations

import pytest

from tests.serve.conftest import text_of

EASY = "import os\n" * 12
HARD = "qZ7#kP!x 9@Lr&vW2^ mB4*tY8 (Jd0%eN6)"


@pytest.mark.slow
@pytest.mark.parametrize("model,tier,lane", [
    ("fastmode-fast", None, "fast"), ("fastmode-fast", "priority", "fast"),
    ("fastmode-full", None, "standard"), ("fastmode-full", "default", "standard"),
    ("fastmode-full", "auto", "standard"), ("fastmode-full", "priority", "priority"),
])
def test_explicit_choices_are_honored(app, model, tier, lane):
    status, events = app().generate(model=model, service_tier=tier, input="x = 1\n", max_output_tokens=4)
    assert status == 200, events
    assert (events[0]["lane"], events[-1]["lane"], events[-1]["model"]) == (lane, lane, model)
    assert events[0]["route"] == {"by": "model"}


@pytest.mark.slow
def test_auto_routes_easy_to_fast_and_hard_to_full(app):
    routes = {}
    for name, prompt in (("easy", EASY), ("hard", HARD)):
        status, events = app().generate(model="auto", input=prompt, max_output_tokens=4)
        assert status == 200, events
        routes[name] = events[0]
    easy, hard = routes["easy"], routes["hard"]
    assert easy["route"]["by"] == hard["route"]["by"] == "auto"
    assert easy["route"]["difficulty"] <= easy["route"]["threshold"] < hard["route"]["difficulty"]
    assert (easy["lane"], easy["model"]) == ("fast", "fastmode-fast")
    assert (hard["lane"], hard["model"]) == ("standard", "fastmode-full")
    status, events = app().generate(model="auto", service_tier="priority", input=HARD, max_output_tokens=4)
    assert events[0]["lane"] == "priority"


@pytest.mark.slow
@pytest.mark.parametrize("body,status,code,says", [
    ({"model": "gpt-5", "input": "x"}, 404, "unknown_model", "fastmode-full"),
    ({"model": "fastmode-full", "service_tier": "flex", "input": "x"}, 400, "unknown_service_tier", "priority"),
    ({"model": "fastmode-fast", "input": "x", "temperature": -1}, 400, "invalid_request", "temperature"),
    ({"model": "fastmode-fast", "input": "x", "top_p": "high"}, 400, "invalid_request", "top_p"),
    ({"model": "fastmode-fast", "input": "x", "colour": 1}, 400, "invalid_request", "colour"),
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
        status, events = a.generate(**long)
        assert status == 429, events
        assert events[0]["code"] == "overloaded" and events[0]["retry_after"] > 0
        status, events = a.generate(**(long | {"allow_spill": True, "max_output_tokens": 8}))
        assert status == 200, events
        assert events[0]["lane"] == events[-1]["lane"] == "standard"
        assert events[0]["route"]["spilled_from"] == "priority"
        assert events[-1]["cost_units"] == pytest.approx(events[-1]["usage"]["total_tokens"] / 1000)
    status, events = a.generate(**(long | {"max_output_tokens": 4}))  # room again once they are gone
    assert status == 200 and events[-1]["lane"] == "priority", events
    assert text_of(events)
