"""``bench.turns.steady``: every measured turn, the first as much as the last, meets the other slots'
conversations running; each measured conversation is measured once; the conversations around them
are cut off at the end, and a real failure among them still fails the run. Every conversation gets
the think time, and a measured one's wall time leaves it out. ``bench.turns.think``: the pauses."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from bench.turns import steady, think

TURNS = 8


class FakeServer:
    """Conversations whose turns take ``turn_s`` each; counts the conversations running halfway
    through each turn (a slot moves to its next conversation within one pass of the event loop)."""

    def __init__(self, turn_s: float = 0.002, fail_on: str | None = None) -> None:
        self.turn_s, self.fail_on = turn_s, fail_on
        self.running = 0
        self.started: list[str] = []
        self.cut_off = 0
        self.seen_at_turn: dict[str, list[int]] = {}
        self.think_s: dict[str, float] = {}

    async def run(self, url, key, lane, lines, tokens, on_turn=None, think_s=0.0) -> list[dict]:
        name = lines[0]
        self.think_s[name] = think_s
        self.started.append(name)
        self.running += 1
        seen = self.seen_at_turn.setdefault(name, [])
        try:
            out = []
            for k in range(len(lines)):
                if name == self.fail_on and k == 2:
                    raise RuntimeError(f"turn {k} of {name} failed")
                if think_s:
                    await asyncio.sleep(think_s)
                await asyncio.sleep(self.turn_s / 2)
                seen.append(self.running)
                await asyncio.sleep(self.turn_s / 2)
                out.append({"ttft_s": self.turn_s, "turn": k, "think_s": think_s})
                if on_turn:
                    on_turn(k + 1)
            return out
        except asyncio.CancelledError:
            self.cut_off += 1
            raise
        finally:
            self.running -= 1


def conversations(prefix: str, n: int) -> list[list[str]]:
    return [[f"{prefix}{i}"] + [f"line {k}" for k in range(1, TURNS)] for i in range(n)]


@pytest.mark.parametrize("slots", [1, 2, 4])
def test_every_measured_turn_meets_the_other_slots_running(slots):
    server = FakeServer()
    measured, background = conversations("m", slots), conversations("b", 3)
    results = asyncio.run(steady(server.run, "http://x", None, "fast", measured, background, TURNS, 8))
    assert sorted(len(r["turns"]) for r in results) == [TURNS] * slots and all(r["wall_s"] > 0 for r in results)
    for lines in measured:
        name = lines[0]
        assert server.started.count(name) == 1
        assert server.seen_at_turn[name] == [slots] * TURNS, (name, server.seen_at_turn[name])
    assert server.running == 0  # nothing left behind
    assert all(not name.startswith("m") for name in server.started[:slots])  # each slot's first is not measured
    if slots > 1:
        assert server.cut_off >= 1  # the conversations around the last measured one were cut off


def test_a_failure_around_the_measured_conversations_fails_the_run():
    server = FakeServer(fail_on="b0")
    with pytest.raises(RuntimeError, match="turn 2 of b0"):
        asyncio.run(steady(server.run, "http://x", None, "fast", conversations("m", 2), conversations("b", 2),
                           TURNS, 8))


def test_every_conversation_thinks_and_the_wall_time_leaves_it_out():
    pause, slots = 0.01, 2
    server = FakeServer(turn_s=0.002)
    t0 = time.perf_counter()
    results = asyncio.run(steady(server.run, "http://x", None, "fast", conversations("m", slots),
                                 conversations("b", 2), TURNS, 8, think_s=pause))
    elapsed = time.perf_counter() - t0
    assert set(server.think_s.values()) == {pause}  # measured and background conversations alike
    for r in results:
        assert sum(t["think_s"] for t in r["turns"]) == pytest.approx(TURNS * pause)
        # a measured conversation runs TURNS * (pause + turn_s); its wall time is the turns' part
        assert TURNS * server.turn_s * 0.9 <= r["wall_s"] < TURNS * pause
    assert elapsed > 2 * TURNS * pause  # each slot's first conversation and its measured one both paused


def test_think_pauses_uniformly_up_to_twice_the_mean_and_repeats_per_seed():
    async def pauses(seed: str, mean: float, n: int) -> list[float]:
        rng = random.Random(seed)
        return [await think(rng, mean) for _ in range(n)]

    got = asyncio.run(pauses("def f(x):", 0.002, 40))
    assert all(0 <= p <= 0.004 for p in got) and len(set(got)) == 40
    assert 0.001 < sum(got) / len(got) < 0.003
    assert asyncio.run(pauses("def f(x):", 0.002, 40)) == got  # the same conversation: the same pauses both ways
    assert asyncio.run(pauses("import os", 0.002, 40)) != got
    assert asyncio.run(pauses("def f(x):", 0.0, 5)) == [0.0] * 5
