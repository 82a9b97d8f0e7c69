"""``SpeculativeLaneEngine``, the exact lane's default engine, on its own: the full model's greedy
output in transformers, stop strings, cancel, typed errors, its prefix cache, and an engine that
dies mid-stream."""

from __future__ import annotations

import asyncio

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from models import FAST, FULL
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

    full, fast = shipped(FULL), shipped(FAST)
    config = ExactLaneConfig(compile=False)  # compiled: tests/sharding/test_speculative.py
    e = SpeculativeLaneEngine(full, fast, config, Tokenizer.from_file(str(full / "tokenizer.json")))
    yield e
    e.shutdown()


def ids(text: str) -> list[int]:
    return AutoTokenizer.from_pretrained(shipped(FULL))(text).input_ids


async def collect(engine, request: EngineRequest) -> list:
    return [o async for o in engine.generate(request)]


def test_streams_the_full_models_greedy_output_with_its_drafts(engine):
    prompt = ids(PROMPT)
    outs = asyncio.run(collect(engine, EngineRequest("a", prompt, max_tokens=40, temperature=0, ignore_eos=True)))
    tokens = [t for o in outs for t in o.token_ids]
    assert tokens == hf_greedy(shipped(FULL), prompt, 40)
    assert "".join(o.text for o in outs) == AutoTokenizer.from_pretrained(shipped(FULL)).decode(
        tokens, skip_special_tokens=True)
    assert outs[-1].finish_reason == "length" and all(o.finish_reason is None for o in outs[:-1])
    assert outs[0].queue_s >= 0 and outs[0].batch_size == 1
    s = outs[-1].speculative
    assert s["draft_tokens"] == 3 and s["verify_steps"] >= 1 and 0 <= s["accepted"] <= s["drafted"]
    assert s["tokens_per_step"] == pytest.approx(1 + s["accepted"] / s["verify_steps"])
    assert engine.num_unfinished() == 0


def test_a_conversations_next_turn_reuses_its_history(engine):
    first = ids(PROMPT + "    ")
    outs = asyncio.run(collect(engine, EngineRequest("t1", first, max_tokens=20, temperature=0, ignore_eos=True)))
    history = first + [t for o in outs for t in o.token_ids] + ids("\n# next")[1:]
    again = asyncio.run(collect(engine, EngineRequest("t2", history, max_tokens=12, temperature=0, ignore_eos=True)))
    assert again[0].cached_tokens >= len(first) + 20 - 3  # all but the last few tokens (sharding.speculative)
    assert [t for o in again for t in o.token_ids] == hf_greedy(shipped(FULL), history, 12)


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

    e = SpeculativeLaneEngine(shipped(FULL), shipped(FAST), ExactLaneConfig(compile=False),
                              Tokenizer.from_file(str(shipped(FULL) / "tokenizer.json")))
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
