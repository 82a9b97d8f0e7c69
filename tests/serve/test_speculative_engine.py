"""``SpeculativeLaneEngine``, the exact lane's default engine, on its own: the full model's greedy
output in transformers, stop strings, cancel, typed errors, its prefix cache, and an engine that
dies mid-stream."""

from __future__ import annotations

import asyncio

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from models import TEST_FAST, TEST_FULL
from serve.config import ExactLaneConfig
from serve.errors import LaneUnavailable
from serve.lanes.engine import EngineRequest
from sharding.errors import PromptTooLong
from tests.conftest import shipped
from tests.sharding.conftest import hf_greedy

PROMPT = "def read_config(path):\n"


@pytest.fixture(scope="module")
def engine():
    from serve.lanes.speculative_engine import SpeculativeLaneEngine

    full, fast = shipped(TEST_FULL), shipped(TEST_FAST)
    config = ExactLaneConfig(compile=False)  # compiled: tests/sharding/test_speculative.py
    e = SpeculativeLaneEngine(full, fast, config, Tokenizer.from_file(str(full / "tokenizer.json")))
    yield e
    e.shutdown()


def ids(text: str) -> list[int]:
    return AutoTokenizer.from_pretrained(shipped(TEST_FULL))(text).input_ids


async def collect(engine, request: EngineRequest) -> list:
    return [o async for o in engine.generate(request)]


def test_streams_the_full_models_greedy_output_with_its_drafts(engine):
    prompt = ids(PROMPT)
    outs = asyncio.run(collect(engine, EngineRequest("a", prompt, max_tokens=40, temperature=0, ignore_eos=True)))
    tokens = [t for o in outs for t in o.token_ids]
    assert tokens == hf_greedy(shipped(TEST_FULL), prompt, 40)
    assert "".join(o.text for o in outs) == AutoTokenizer.from_pretrained(shipped(TEST_FULL)).decode(
        tokens, skip_special_tokens=True)
    assert outs[-1].finish_reason == "length" and all(o.finish_reason is None for o in outs[:-1])
    assert outs[0].queue_s >= 0 and outs[0].batch_size == 1
    s = outs[-1].speculative
    assert s["draft_tokens"] == ExactLaneConfig().num_speculative_tokens and s["verify_steps"] >= 1
    assert 0 <= s["accepted"] <= s["drafted"] <= s["draft_tokens"] * s["verify_steps"]
    assert s["tokens_per_step"] == pytest.approx(1 + s["accepted"] / s["verify_steps"])
    assert engine.num_unfinished() == 0


def test_the_reported_k_is_the_configured_one_while_adaptive_k_changes_mid_request(engine, monkeypatch):
    """Adaptive k follows measured step times; a request's report must not take the engine's latest k
    (forced here to 0, with its probe rounds of 1), which is below what the request's rounds drafted."""
    import sharding.speculative

    monkeypatch.setattr(sharding.speculative, "best_k", lambda *args, **kwargs: 0)
    outs = asyncio.run(collect(engine, EngineRequest("k", ids(PROMPT), max_tokens=60, temperature=0, ignore_eos=True)))
    s = outs[-1].speculative
    assert engine._engine.k < s["draft_tokens"] == ExactLaneConfig().num_speculative_tokens  # k dropped in this request
    assert s["drafted"] <= s["draft_tokens"] * s["verify_steps"]
    assert 1 <= s["tokens_per_step"] <= 1 + s["draft_tokens"]


def test_a_conversations_next_turn_reuses_its_history(engine):
    first = ids(PROMPT + "    ")
    outs = asyncio.run(collect(engine, EngineRequest("t1", first, max_tokens=20, temperature=0, ignore_eos=True)))
    history = first + [t for o in outs for t in o.token_ids] + ids("\n# next")[1:]
    again = asyncio.run(collect(engine, EngineRequest("t2", history, max_tokens=12, temperature=0, ignore_eos=True)))
    assert again[0].cached_tokens == len(first) + 20 - 1  # all the target held: all but the last token
    assert [t for o in again for t in o.token_ids] == hf_greedy(shipped(TEST_FULL), history, 12)


def test_a_stop_string_ends_the_text_and_frees_the_slot(engine):
    prompt = ids(PROMPT)
    full = asyncio.run(collect(engine, EngineRequest("s0", prompt, max_tokens=40, temperature=0, ignore_eos=True)))
    text = "".join(o.text for o in full)
    stop = text[10:14]
    outs = asyncio.run(collect(engine, EngineRequest("s1", prompt, max_tokens=40, temperature=0, stop=[stop],
                                                     ignore_eos=True)))
    assert "".join(o.text for o in outs) == text[:text.index(stop)] and outs[-1].finish_reason == "stop"
    assert _drained(engine)


def test_closing_the_stream_aborts_the_request(engine):
    async def run():
        stream = engine.generate(EngineRequest("c", ids(PROMPT), max_tokens=300, temperature=0, ignore_eos=True))
        await stream.__anext__()
        await stream.aclose()

    asyncio.run(run())
    assert _drained(engine)
    # the next request is served (the slot was freed)
    outs = asyncio.run(collect(engine, EngineRequest("c2", ids(PROMPT), max_tokens=5, temperature=0)))
    assert sum(len(o.token_ids) for o in outs) >= 1


def test_bad_input_gets_typed_errors_before_it_is_queued(engine):
    with pytest.raises(PromptTooLong):
        asyncio.run(collect(engine, EngineRequest("long", ids(PROMPT), max_tokens=engine.max_len, temperature=0)))
    assert engine.num_unfinished() == 0


def test_an_engine_that_dies_mid_stream_fails_its_requests_unavailable(engine, monkeypatch):
    from serve.lanes.speculative_engine import SpeculativeLaneEngine

    e = SpeculativeLaneEngine(shipped(TEST_FULL), shipped(TEST_FAST), ExactLaneConfig(compile=False),
                              Tokenizer.from_file(str(shipped(TEST_FULL) / "tokenizer.json")))
    try:
        real, steps = e._engine.step, []

        def step():
            steps.append(1)
            if len(steps) == 3:
                raise RuntimeError("a chip fell over")
            return real()

        monkeypatch.setattr(e._engine, "step", step)

        async def run():
            got = []
            with pytest.raises(LaneUnavailable, match="a chip fell over"):
                async for o in e.generate(EngineRequest("d", ids(PROMPT), max_tokens=100, temperature=0)):
                    got.append(o)
            return got

        assert asyncio.run(asyncio.wait_for(run(), 30))  # outputs before the failure, then the error
        assert isinstance(e.failure(), RuntimeError)
        with pytest.raises(LaneUnavailable):
            asyncio.run(e.check_health())
        with pytest.raises(LaneUnavailable):
            asyncio.run(collect(e, EngineRequest("d2", ids(PROMPT), max_tokens=4, temperature=0)))
    finally:
        e.shutdown()


def _drained(engine, timeout: float = 10.0) -> bool:
    """The engine thread has dropped every request (an abort is queued to it)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not engine._engine.has_work and engine.num_unfinished() == 0:
            return True
        time.sleep(0.05)
    return False


def _exact_with_gated_compile(monkeypatch, fail: bool = False, building=None):
    """A ``SpeculativeLaneEngine`` compiling in the background whose compiled engine is eager models
    (built the same way, fast) handed over only once ``gate`` is set (or whose compile raises);
    ``building`` (an event) is set once the compile thread is inside its build."""
    import threading

    from serve.lanes.speculative_engine import SpeculativeLaneEngine

    gate, real = threading.Event(), SpeculativeLaneEngine._build

    def build(self, path, draft_path, compile):
        if not compile:
            return real(self, path, draft_path, False)
        if building is not None:
            building.set()
        gate.wait(60)
        if fail:
            raise RuntimeError("no C++ compiler")
        return real(self, path, draft_path, False)

    monkeypatch.setattr(SpeculativeLaneEngine, "_build", build)
    e = SpeculativeLaneEngine(shipped(TEST_FULL), shipped(TEST_FAST), ExactLaneConfig(compile=True, compile_in_background=True),
                              Tokenizer.from_file(str(shipped(TEST_FULL) / "tokenizer.json")))
    return e, gate


def _compile_thread():
    import threading

    from serve.lanes.speculative_engine import COMPILE_THREAD_NAME

    return next(t for t in threading.enumerate() if t.name == COMPILE_THREAD_NAME)


def test_a_background_compile_takes_over_new_requests_while_running_ones_end_on_the_eager_engine(monkeypatch):
    import threading

    e, gate = _exact_with_gated_compile(monkeypatch)
    try:
        assert e.compile_status()["state"] == "compiling"  # serving already, on the eager engine
        eager, hold, steps = e._engine, threading.Event(), []
        real_step = eager.step

        def step():  # the eager engine's first round waits until the switch is queued behind it
            steps.append(1)
            if len(steps) == 2:
                hold.wait(30)
            return real_step()

        monkeypatch.setattr(eager, "step", step)
        prompt = ids(PROMPT)

        async def run():
            stream = e.generate(EngineRequest("r1", prompt, max_tokens=60, temperature=0, ignore_eos=True))
            outs = [await stream.__anext__()]  # r1 is running on the eager engine
            gate.set()
            await asyncio.to_thread(_compile_thread().join, 30)  # the switch is queued
            hold.set()
            outs += [o async for o in stream]
            return outs

        r1 = [t for o in asyncio.run(asyncio.wait_for(run(), 60)) for t in o.token_ids]
        assert r1 == hf_greedy(shipped(TEST_FULL), prompt, 60)
        status = e.compile_status()
        assert status["state"] == "compiled" and status["seconds"] >= 0 and e._engine is not eager
        assert eager.stats.tokens == len(r1) - 1  # every round of r1 on the eager engine (its first token: the prefill)
        r2 = asyncio.run(collect(e, EngineRequest("r2", prompt, max_tokens=20, temperature=0, ignore_eos=True)))
        assert [t for o in r2 for t in o.token_ids] == r1[:20]
        assert e._engine.stats.tokens == 20 - 1 and eager.stats.tokens == len(r1) - 1  # r2 on the new one alone
    finally:
        gate.set()
        e.shutdown()


def test_a_background_compile_shortens_the_switch_interval_until_it_ends(monkeypatch):
    """The eager engine thread takes the GIL back from the compile thread's tracing within
    ``COMPILE_SWITCH_INTERVAL_S``, not the interpreter's default 5 ms, while the compile runs."""
    import sys
    import threading

    from serve.lanes.speculative_engine import COMPILE_SWITCH_INTERVAL_S

    before, building = sys.getswitchinterval(), threading.Event()
    e, gate = _exact_with_gated_compile(monkeypatch, building=building)
    try:
        assert building.wait(30)
        assert sys.getswitchinterval() == pytest.approx(min(before, COMPILE_SWITCH_INTERVAL_S))
        assert COMPILE_SWITCH_INTERVAL_S < before  # the interpreter's default (5 ms) here
        compiling = _compile_thread()
        gate.set()
        compiling.join(30)
        assert not compiling.is_alive() and e.compile_status()["error"] is None
        assert sys.getswitchinterval() == before
    finally:
        gate.set()
        e.shutdown()


def test_a_failed_background_compile_leaves_the_lane_serving_eager(monkeypatch):
    e, gate = _exact_with_gated_compile(monkeypatch, fail=True)
    try:
        gate.set()
        _compile_thread().join(30)
        status = e.compile_status()
        assert status["state"] == "failed" and "no C++ compiler" in status["error"]
        asyncio.run(e.check_health())  # healthy: the eager engine serves on
        outs = asyncio.run(collect(e, EngineRequest("f", ids(PROMPT), max_tokens=12, temperature=0, ignore_eos=True)))
        assert [t for o in outs for t in o.token_ids] == hf_greedy(shipped(TEST_FULL), ids(PROMPT), 12)
    finally:
        e.shutdown()


@pytest.mark.full  # a compile of every warm-up shape in a thread (minutes cold)
def test_after_the_background_compile_requests_run_compiled_and_compile_nothing():
    # Graphs compiled in the compile thread serve the engine thread (dynamo's guards hold there too).
    import time

    from torch._dynamo.utils import counters

    from serve.lanes.speculative_engine import SpeculativeLaneEngine

    e = SpeculativeLaneEngine(shipped(TEST_FULL), shipped(TEST_FAST), ExactLaneConfig(),
                              Tokenizer.from_file(str(shipped(TEST_FULL) / "tokenizer.json")))
    try:
        deadline = time.monotonic() + 1500
        while e.compile_status()["state"] == "compiling" and time.monotonic() < deadline:
            time.sleep(1)
        assert e.compile_status()["state"] == "compiled", e.compile_status()
        graphs = counters["stats"]["unique_graphs"]
        prompt = ids(PROMPT)

        async def two():  # one stream, then two at once: every row count of the lane's batch
            a = await collect(e, EngineRequest("c1", prompt, max_tokens=40, temperature=0, ignore_eos=True))
            b, c = await asyncio.gather(*(collect(e, EngineRequest(f"c{i}", prompt[:-i] or prompt, max_tokens=30,
                                                                   temperature=0, ignore_eos=True)) for i in (2, 3)))
            return a, b, c

        a, b, c = asyncio.run(two())
        assert [t for o in a for t in o.token_ids] == hf_greedy(shipped(TEST_FULL), prompt, 40)
        assert [t for o in b for t in o.token_ids] == hf_greedy(shipped(TEST_FULL), prompt[:-2], 30)
        assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled on a request
    finally:
        e.shutdown()
