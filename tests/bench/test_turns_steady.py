"""``bench.turns.steady``: every measured turn, the first as much as the last, meets the other slots'
conversations running; each measured conversation is measured once; the conversations around them
are cut off at the end, and a real failure among them still fails the run."""

from __future__ import annotations

import asyncio

import pytest

from bench.turns import steady

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

    async def run(self, url, key, lane, lines, tokens, on_turn=None) -> list[dict]:
        name = lines[0]
        self.started.append(name)
        self.running += 1
        seen = self.seen_at_turn.setdefault(name, [])
        try:
            out = []
            for k in range(len(lines)):
                if name == self.fail_on and k == 2:
                    raise RuntimeError(f"turn {k} of {name} failed")
                await asyncio.sleep(self.turn_s / 2)
                seen.append(self.running)
                await asyncio.sleep(self.turn_s / 2)
                out.append({"ttft_s": self.turn_s, "turn": k})
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
