"""Each lane streams what its engine produces when called directly (vLLM for the full model,
fastmode's executor for the fast one) and what transformers produces; usage, timing and cost are
reported; stop strings end the text as vLLM's do; a closed stream frees its engine sequence."""

from __future__ import annotations

import contextlib

import time

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from bench.soak import cancelled
from models import TEST_FAST, TEST_FULL
from sharding.engine import Engine
from sharding.sampling import SamplingParams
from tests.conftest import shipped
from tests.models.test_vllm_loads import MAX_TOKENS, PROMPTS
from tests.serve.conftest import text_of

MODEL = {"fast": ("fastmode-fast", None), "priority": ("fastmode-full", "priority"),
         "standard": ("fastmode-full", "default"), "exact": ("fastmode-full", "exact")}
PRICE = {"fast": 1.0, "priority": 6.0, "standard": 1.0, "exact": 6.0}
LANES = list(MODEL)


def request(lane: str, prompt: str, **kw) -> dict:
    model, tier = MODEL[lane]
    return {"model": model, "service_tier": tier, "input": prompt, "temperature": 0,
            "max_output_tokens": MAX_TOKENS, "ignore_eos": True, **kw}


@pytest.fixture(scope="module")
def references(vllm_references) -> dict:
    """Greedy tokens per (model, prompt): from each engine called directly, and from transformers."""
    refs = {}
    for name, path in (("full", shipped(TEST_FULL)), ("fast", shipped(TEST_FAST))):
        tok = AutoTokenizer.from_pretrained(path)
        hf = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        prompts = [tok(p, return_tensors="pt").input_ids for p in PROMPTS]
        refs[name, "transformers"] = [
            hf.generate(ids, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False,
                        pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist() for ids in prompts]
        if name == "fast":
            engine = Engine.from_pretrained(path)
            refs[name, "engine"] = engine.generate([ids[0].tolist() for ids in prompts],
                                                   SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
        else:
            refs[name, "engine"] = [o["token_ids"] for o in vllm_references["full"]]
        refs[name, "tokenizer"] = tok
    return refs


@pytest.mark.slow
@pytest.mark.parametrize("lane", LANES)
def test_lane_streams_its_engines_greedy_text(app, references, lane):
    model = "fast" if lane == "fast" else "full"
    tok = references[model, "tokenizer"]
    for i, prompt in enumerate(PROMPTS):
        status, events = app().generate(**request(lane, prompt))
        assert status == 200, events
        assert [e["type"] for e in events[:1] + events[-1:]] == ["created", "done"], events
        assert events[0]["lane"] == lane and events[-1]["lane"] == lane
        engine_ids, hf_ids = references[model, "engine"][i], references[model, "transformers"][i]
        assert engine_ids == hf_ids, f"the references disagree on {prompt!r}"
        assert text_of(events) == tok.decode(engine_ids, skip_special_tokens=True), prompt
        done = events[-1]
        n = len(tok(prompt).input_ids)
        cached = done["usage"]["input_tokens_details"]["cached_tokens"]  # an earlier test's prompt may be reused
        assert done["usage"] == {"input_tokens": n, "output_tokens": MAX_TOKENS, "total_tokens": n + MAX_TOKENS,
                                 "input_tokens_details": {"cached_tokens": cached}} and 0 <= cached < n
        assert done["finish_reason"] == "length"


@pytest.mark.slow
@pytest.mark.parametrize("lane", LANES)
def test_sampling_values_too_small_for_float32_give_the_greedy_text(app, references, lane):
    """A denormal temperature is greedy (below vLLM's 1e-5) and a denormal top_p keeps only the most
    likely token: either gives transformers' greedy text. The exact lane crashed on the top_p (it
    kept no token, and ``torch.multinomial`` refused the NaNs), and was rebuilt: CI's fuzz found it."""
    model = "fast" if lane == "fast" else "full"
    tok = references[model, "tokenizer"]
    want = tok.decode(references[model, "transformers"][0], skip_special_tokens=True)
    for hostile in ({"temperature": 5e-324}, {"temperature": 1.0, "top_p": 5e-324}):
        status, events = app().generate(**request(lane, PROMPTS[0], **hostile))
        assert status == 200 and events[-1]["type"] == "done", (hostile, events[-3:])
        assert events[-1]["lane"] == lane and text_of(events) == want, hostile


@pytest.mark.slow
@pytest.mark.parametrize("lane", LANES)
def test_stop_string_ends_the_text_as_vllm_does(app, references, lane):
    model = "fast" if lane == "fast" else "full"
    tok = references[model, "tokenizer"]
    prompt = PROMPTS[1]
    full_text = tok.decode(references[model, "engine"][1], skip_special_tokens=True)
    stop = next(s for s in ("\n", ":", " ") if s in full_text.strip())
    status, events = app().generate(**request(lane, prompt, stop=[stop, "@@never@@"]))
    assert status == 200, events
    assert text_of(events) == full_text[:full_text.index(stop)]
    assert events[-1]["finish_reason"] == "stop"


@pytest.mark.slow
@pytest.mark.parametrize("lane", LANES)
def test_done_reports_usage_timing_and_cost(app, lane):
    status, events = app().generate(**request(lane, "def add(a, b):\n", max_output_tokens=16))
    assert status == 200, events
    created, deltas, done = events[0], events[1:-1], events[-1]
    assert created["model"] == done["model"] == MODEL[lane][0]
    assert [d["seq"] for d in deltas] == list(range(len(deltas)))
    assert all(d["id"] == created["id"] == done["id"] for d in deltas)
    usage, timing = done["usage"], done["timing"]
    assert usage["output_tokens"] == 16 == sum(d["tokens"] for d in deltas)
    assert done["cost_units"] == pytest.approx(PRICE[lane] * usage["total_tokens"] / 1000)
    assert 0 < timing["engine_ttft_s"] <= timing["ttft_s"] < timing["total_s"]
    assert timing["decode_tokens_per_s"] > 0


@pytest.mark.slow
def test_the_fast_lane_streams_from_its_rings_head(app):
    """The front door runs the fast lane's request path itself and streams from the ring's head chip
    (``serve.lanes.head_links``); the replica, which owns the ring, is one more client of it."""
    a = app()
    status, events = a.generate(**request("fast", "def add(a, b):\n", max_output_tokens=16))
    assert status == 200 and events[-1]["type"] == "done", events
    stats = a.lane_stats("fast")
    assert stats["head_links"] == {"up": 1, "in_flight": 0, "cancelled": stats["head_links"]["cancelled"]}, stats
    # The replica's own link and each front door's (the gateway's, the gRPC server's).
    assert stats["ring_clients"] >= 2 and stats["running"] == 0, stats


@pytest.mark.slow
@pytest.mark.parametrize("lane", LANES)
def test_closing_a_stream_frees_its_engine_sequence(app, lane):
    a = app()
    before = cancelled(a.lane_stats(lane))
    # The whole context (``max_output_tokens`` null): the longest a stream can run.
    with contextlib.ExitStack() as hold:
        with a.stream(**request(lane, "class Parser:\n", max_output_tokens=None)) as (status, events):
            assert status == 200
            assert next(events)["type"] == "created"
            assert next(events)["type"] == "delta"
            paused = hold.enter_context(a.paused(lane))  # the stream cannot end before its close
            if lane in ("priority", "standard"):  # (the others' stats would ask their stopped engines)
                assert (held := a.lane_stats(lane))["in_flight"] == 1, held
        paused.reached_engine()  # closed: the lane's stream is cut
    deadline = time.monotonic() + 30
    while (stats := a.lane_stats(lane))["running"] or stats["in_flight"]:
        assert time.monotonic() < deadline, f"the {lane} lane still holds the sequence: {stats}"
        time.sleep(0.2)
    assert cancelled(stats) == before + 1
