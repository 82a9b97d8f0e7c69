"""vLLM streaming-input sessions (``serve.lanes.vllm_sessions``) on a real vLLM engine in process: a
conversation's turns continue one session and equal vLLM's own plain requests token for token; a
request that needs a slot closes the longest parked session; a cancelled turn, and a session parked
too long, leave nothing in the engine; requests a session cannot take run as plain requests."""

from __future__ import annotations

import asyncio
import time

import pytest

from serve.lanes.engine import EngineRequest
from serve.lanes.vllm_sessions import eligible

LINES = ["def parse(line):", "    parts = line.split(',')", "    return [int(p) for p in parts]",
         "def total(rows):", "    return sum(parse(r) for r in rows)", "class Point:"]


@pytest.fixture(scope="module")
def engine():
    """The priority lane's engine (2 slots) and the event loop every test runs it on."""
    from tokenizers import Tokenizer

    from models import TEST_FULL
    from serve.config import PriorityLaneConfig
    from serve.lanes.vllm_engine import VLLMLaneEngine
    from tests.conftest import shipped

    shipped(TEST_FULL)
    with asyncio.Runner() as runner:
        e = VLLMLaneEngine(TEST_FULL, PriorityLaneConfig())
        e.tokenizer = Tokenizer.from_file(str(TEST_FULL / "tokenizer.json"))
        e.run = runner.run
        yield e
        e.shutdown()


async def collect(engine, request: EngineRequest) -> tuple[list[int], str, list]:
    ids, text, outs = [], "", []
    async for o in engine.generate(request):
        ids += o.token_ids
        text += o.text
        outs.append(o)
    return ids, text, outs


def encode(engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text, add_special_tokens=False).ids


async def idle(engine, timeout_s: float = 10.0) -> None:
    """Until vLLM holds no request (an abort reaches its engine core asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while engine.engine.get_num_unfinished_requests() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


@pytest.mark.slow
def test_a_conversations_turns_continue_its_session_and_equal_plain_requests(engine):
    async def conversation(tag: str) -> list[tuple[list[int], str, int | None]]:
        ids, turns = [], []
        for k, line in enumerate(LINES):
            ids = ids + encode(engine, ("\n" if k else "") + line)
            out, text, outs = await collect(engine, EngineRequest(f"{tag}{k}", ids, 8, temperature=0,
                                                                  ignore_eos=True, continues=True))
            assert outs[-1].finish_reason == "length" and all(o.finish_reason is None for o in outs[:-1])
            turns.append((out, text, outs[0].cached_tokens))
            ids = ids + out  # the next turn continues exactly what was generated
        return turns

    sessions = engine.sessions
    continued = sessions.continued
    with_sessions = engine.run(conversation("s"))
    assert sessions.continued - continued == len(LINES) - 1
    engine.sessions = None  # the same engine, every turn a plain vLLM request (its prefix cache on)
    try:
        plain = engine.run(conversation("p"))
    finally:
        engine.sessions = sessions
    for k, ((out, text, cached), (want, want_text, _)) in enumerate(zip(with_sessions, plain, strict=True)):
        assert out == want and text == want_text == engine.tokenizer.decode(want), k
    # Turn k + 1 reused every token vLLM had computed: turn k's prompt and its output but the last token.
    prompt = 0
    for k, line in enumerate(LINES[:-1]):
        prompt += len(encode(engine, ("\n" if k else "") + line))
        assert with_sessions[k + 1][2] == prompt + len(with_sessions[k][0]) - 1, k
        prompt += len(with_sessions[k][0])
    engine.run(engine.sessions.close_all())
    engine.run(idle(engine))


@pytest.mark.slow
def test_a_request_without_a_slot_closes_the_longest_parked_session(engine):
    sessions = engine.sessions

    async def go():
        await sessions.close_all()
        first = [await collect(engine, EngineRequest(f"slot{i}", encode(engine, line), 4, temperature=0, continues=True))
                 for i, line in enumerate(LINES[:2])]
        assert len(sessions.parked) == 2 and engine.engine.get_num_unfinished_requests() == 2  # vLLM's 2 slots
        oldest = next(iter(sessions.parked))
        # A third conversation and a request with a stop string (a plain one): each finds a slot.
        third = await asyncio.wait_for(collect(engine, EngineRequest("slot2", encode(engine, LINES[3]), 4,
                                                                     temperature=0, continues=True)), 60)
        assert oldest not in sessions.parked and len(sessions.parked) == 2
        await asyncio.wait_for(collect(engine, EngineRequest("plain", encode(engine, LINES[4]), 4, temperature=0,
                                                             continues=True, stop=["\x00"])), 60)
        assert len(sessions.parked) == 1 and engine.num_unfinished() == 0
        # The plain request closed the second conversation's session; the third's, parked since, takes
        # its next turn, and the first's next turn opens a new one.
        continued = sessions.continued
        ids = encode(engine, LINES[3]) + third[0] + encode(engine, "\n" + LINES[5])
        await collect(engine, EngineRequest("slot2b", ids, 4, temperature=0, continues=True))
        assert sessions.continued == continued + 1
        ids = encode(engine, LINES[0]) + first[0][0] + encode(engine, "\n" + LINES[5])
        await collect(engine, EngineRequest("slot0b", ids, 4, temperature=0, continues=True))
        assert sessions.continued == continued + 1 and len(sessions.parked) == 2

    engine.run(go())
    engine.run(sessions.close_all())
    engine.run(idle(engine))
    assert engine.engine.get_num_unfinished_requests() == 0


@pytest.mark.slow
def test_a_cancelled_turn_aborts_its_session(engine):
    sessions = engine.sessions

    async def go():
        await sessions.close_all()
        stream = engine.generate(EngineRequest("long", encode(engine, LINES[0]), 200, temperature=0,
                                               ignore_eos=True, continues=True))
        got = [await anext(stream) for _ in range(2)]
        assert got[0].token_ids and engine.num_unfinished() == 1
        await stream.aclose()  # the caller went away mid-turn
        assert not sessions.parked
        await idle(engine)
        assert engine.engine.get_num_unfinished_requests() == 0

    engine.run(go())


@pytest.mark.slow
def test_a_session_parked_longer_than_idle_s_closes(engine):
    sessions = engine.sessions

    async def go():
        await sessions.close_all()
        await idle(engine)
        sessions.idle_s, before = 0.2, sessions.idle_s
        try:
            await collect(engine, EngineRequest("idle", encode(engine, LINES[1]), 4, temperature=0, continues=True))
            assert len(sessions.parked) == 1
            await asyncio.sleep(0.5)
            assert not sessions.parked
            await idle(engine)
            assert engine.engine.get_num_unfinished_requests() == 0
        finally:
            sessions.idle_s = before

    engine.run(go())


@pytest.mark.slow
def test_parked_sessions_hold_at_most_their_share_of_the_kv_cache(engine):
    sessions = engine.sessions
    cache = engine.engine.vllm_config.cache_config
    assert sessions.budget == int(0.25 * cache.num_gpu_blocks * cache.block_size)

    async def go():
        await sessions.close_all()
        await idle(engine)
        budget = sessions.budget
        try:
            await collect(engine, EngineRequest("kv0", encode(engine, LINES[0]), 4, temperature=0, continues=True))
            first = next(iter(sessions.parked))
            # room for either session alone (the second's: its prompt and at most 3 of its 4 tokens), not both
            sessions.budget = max(sessions.parked_tokens, len(encode(engine, LINES[1])) + 3)
            await collect(engine, EngineRequest("kv1", encode(engine, LINES[1]), 4, temperature=0, continues=True))
            assert first not in sessions.parked and len(sessions.parked) == 1  # the longest parked went
            assert sessions.parked_tokens == len(sessions.parked[next(iter(sessions.parked))].tokens)
            deadline = time.monotonic() + 5  # the closed one's abort reaches vLLM
            while engine.engine.get_num_unfinished_requests() > 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert engine.engine.get_num_unfinished_requests() == 1
        finally:
            sessions.budget = budget
            await sessions.close_all()
        assert sessions.parked_tokens == 0

    engine.run(go())


@pytest.mark.parametrize("kw, ok", [({"temperature": 0}, True), ({"temperature": 0.8}, True),
                                     ({"temperature": 0.8, "seed": 3}, False), ({"temperature": 0, "seed": 3}, True),
                                     ({"temperature": 0, "stop": ["\n"]}, False),
                                     ({"temperature": 0, "continues": False}, False)])
def test_which_requests_a_session_takes(kw, ok):
    assert eligible(EngineRequest("r", [1, 2], 4, **({"continues": True} | kw))) is ok


@pytest.mark.slow
def test_a_prompt_that_continues_nothing_parks_nothing(engine):
    async def go():
        await engine.sessions.close_all()
        for i in range(3):  # one fixed prompt, as a load generator sends it
            await collect(engine, EngineRequest(f"fixed{i}", encode(engine, LINES[0]), 4, temperature=0))
        assert not engine.sessions.parked and engine.engine.get_num_unfinished_requests() == 0

    engine.run(go())
