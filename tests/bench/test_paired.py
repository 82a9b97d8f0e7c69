"""``fastmode bench paired``'s plumbing on stand-in servers (no vLLM, no application): the rounds
alternate the two servers, flip their order, and the ratios and report come from the records.

The live run (vLLM's server beside the app) is the suite's ``paired`` stage, run by
``tests/bench/test_suite_smoke.py`` in its quick setting."""

from __future__ import annotations

import asyncio
import json

import pytest

from bench.paired import OURS, THEIRS, alternate, ratios
from bench.report import paired_section
from bench.targets import _record


def stand_in(name: str, seconds_per_token: float, calls: list[str]):
    """A server whose every response takes ``seconds_per_token`` a token on its own clock (the records'
    timestamps), so its end-to-end tokens/s is exact."""
    async def send(tokens: int) -> dict:
        calls.append(name)
        await asyncio.sleep(0)
        return _record(0.0, 0.01, tokens * seconds_per_token, tokens, tokens)
    return send


def test_rounds_alternate_the_servers_and_flip_their_order():
    calls: list[str] = []
    targets = {OURS: stand_in(OURS, 0.002, calls), THEIRS: stand_in(THEIRS, 0.004, calls)}
    rounds = asyncio.run(alternate(targets, [1, 4], rounds=3, tokens=16, per_stream=2, min_per_level=4))
    assert [r["order"] for r in rounds] == [[OURS, THEIRS], [THEIRS, OURS], [OURS, THEIRS]]
    # Each round: a warm-up call per server, then each level on one server and then the other
    # (1 stream: 4 requests each; 4 streams: 2 each, 8 in all).
    per_round = 2 + 4 + 4 + 8 + 8
    assert len(calls) == 3 * per_round
    for i, (a, b) in enumerate([(OURS, THEIRS), (THEIRS, OURS), (OURS, THEIRS)]):
        got = calls[i * per_round:(i + 1) * per_round]
        assert got[:2] == [a, b] and got[2:6] == [a] * 4 and got[6:10] == [b] * 4
        assert got[10:18] == [a] * 8 and got[18:26] == [b] * 8
    r = ratios([x["results"] for x in rounds])
    assert sorted(r) == [1, 4]
    for level in r.values():  # ours takes half the time a token: twice the per-user speed, every round
        assert level["per_user"] == pytest.approx([2.0] * 3) and level["per_user_median"] == pytest.approx(2.0)
        assert len(level["aggregate"]) == 3 and all(x > 0 for x in level["aggregate"])


def test_the_report_shows_every_rounds_ratio_and_the_median():
    calls: list[str] = []
    targets = {OURS: stand_in(OURS, 0.003, calls), THEIRS: stand_in(THEIRS, 0.002, calls)}
    rounds = asyncio.run(alternate(targets, [1], rounds=2, tokens=8, per_stream=1, min_per_level=2))
    doc = json.loads(json.dumps({"command": "fastmode bench paired", "date": "d",
                                 "settings": {"rounds": 2, "tokens": 8}, "rounds": rounds,
                                 "ratios": ratios([x["results"] for x in rounds])}))
    text = "\n".join(paired_section(doc))
    assert "| 1 | 333.3 | 500.0 | **0.67x** (0.67, 0.67) |" in text
    assert paired_section(None)[-2].startswith("Not run")
