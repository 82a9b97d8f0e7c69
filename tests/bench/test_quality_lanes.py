"""``bench.quality`` with a fake server (no app, no model): a tier the server refuses is skipped,
and what it writes (intervals, comparisons with standard, per-sample records, the ``auto`` sweep)
agrees with what it measured."""

from __future__ import annotations

import functools
import json
from contextlib import asynccontextmanager
from types import SimpleNamespace

import pytest

from bench.quality import LANES, ServedLane, measure, plot
from clients.sdk.errors import LaneUnavailable, UnknownServiceTier
from models.eval.stats import wilson
from models.recipe import corpus

LATENCY = {"standard": 0.2, "priority": 0.1, "exact": 0.15, "fast": 0.02}
THRESHOLD = 1.5


def fake_score(prompt: str) -> float:
    return (len(prompt) % 7) / 2


@functools.cache
def held_out() -> list[corpus.SourceFile]:
    return corpus.split(corpus.list_files())[1]


def next_line(prefix: str) -> str:
    """The true next line where the prefix occurs in a held-out file (what a perfect model says)."""
    for f in held_out():
        i = f.text.find(prefix)
        if i >= 0:
            return f.text[i + len(prefix):].split("\n", 1)[0]
    return ""


class FakeServer:
    """Answers like a server with the standard, priority, fast and auto lanes but no exact tier:
    the full model's lanes are always right, fast repeats the previous line, auto routes by
    ``fake_score`` against ``THRESHOLD``."""

    def __init__(self, refuse: dict[str, Exception] | None = None, misroute: dict[str, str] | None = None):
        self.refuse = refuse if refuse is not None else {"exact": UnknownServiceTier(
            "unknown_service_tier", "service_tier must be one of 'auto', 'default', 'priority', got 'exact'")}
        self.misroute = misroute or {}
        self.responses = SimpleNamespace(create=self.create)

    async def create(self, *, model, service_tier, input, **_):
        lane = next(n for n, (m, t) in LANES.items() if (m, t) == (model, service_tier))
        if lane in self.refuse:
            raise self.refuse[lane]
        route = None
        if lane == "auto":
            score = fake_score(input)
            route = {"by": "auto", "difficulty": score, "threshold": THRESHOLD}
            lane = "fast" if score <= THRESHOLD else "standard"
        text = input[:-1].rsplit("\n", 1)[-1] if lane == "fast" else next_line(input)
        timing = SimpleNamespace(total_s=LATENCY[lane], decode_tokens_per_s=1 / LATENCY[lane])
        return SimpleNamespace(text=text, lane=self.misroute.get(lane, lane), timing=timing, route=route)

    def connect(self):
        @asynccontextmanager
        async def client():
            yield self

        return client()


def lanes_on(server: FakeServer) -> list[ServedLane]:
    return [ServedLane(n, "ws://fake", None, lambda texts: [1.0] * len(texts), connect=server.connect)
            for n in LANES]


@pytest.mark.asyncio
async def test_a_tier_the_server_refuses_is_skipped():
    server = FakeServer(refuse={"exact": UnknownServiceTier("unknown_service_tier", "no exact"),
                                "priority": LaneUnavailable("lane_unavailable", "not deployed")},
                        misroute={"fast": "standard"})
    why = {lane.name: await lane.probe() for lane in lanes_on(server)}
    assert why["standard"] is None and why["auto"] is None
    assert "unknown_service_tier" in why["exact"] and "service_tier='exact'" in why["exact"]
    assert "lane_unavailable" in why["priority"]
    assert "served on lane 'standard'" in why["fast"]


def test_the_standard_lane_is_required():
    with pytest.raises(ValueError, match="standard lane"):
        measure(lanes_on(FakeServer(refuse={"standard": UnknownServiceTier("unknown_service_tier", "x")})),
                fake_score, samples=4, max_files=2)


def test_measure_with_a_server_without_the_exact_tier(tmp_path, capsys):
    out, records = measure(lanes_on(FakeServer()), fake_score, samples=24, max_files=2)
    assert "skipping the exact lane" in capsys.readouterr().err
    assert set(out["skipped_lanes"]) == {"exact"} and "unknown_service_tier" in out["skipped_lanes"]["exact"]
    lanes = out["lanes"]
    assert list(lanes) == ["standard", "priority", "fast", "auto"]
    assert len(records) == 24
    for name, v in lanes.items():
        hits = [r["lanes"][name]["hit"] for r in records]
        assert v["exact_match_count"] == sum(hits) and v["exact_match_ci95"] == list(wilson(sum(hits), 24))
        if name != "standard":
            c = v["vs_standard"]
            std = [r["lanes"]["standard"]["hit"] for r in records]
            assert c["a_only_hits"] == sum(h and not s for h, s in zip(hits, std))
            assert c["b_only_hits"] == sum(s and not h for h, s in zip(hits, std))
    assert lanes["standard"]["exact_match_count"] >= 20  # the fake full model is (almost) always right
    assert all(r["lanes"]["fast"]["latency_s"] == 0.02 for r in records)
    # auto: the offline scorer routes as the served router did, and replaying the served threshold
    # on standard gives exactly the served auto's hits.
    assert out["auto_served"]["routing_agreement_with_offline_scorer"] == 1.0
    replay = next(p for p in out["auto_policies"] if p["threshold"] == THRESHOLD and p["full_tier"] == "standard")
    assert replay["exact_match_count"] == lanes["auto"]["exact_match_count"]
    assert {p["full_tier"] for p in out["auto_policies"]} == {"standard", "priority"}
    assert out["auto_policy_frontier"] and out["auto_recommended"]["rule"]
    assert out["difficulty_scoring"]["mean_s"] >= 0
    # The PNG and the report's quality section take it.
    from bench.report import quality_section

    plot({**out, "date": "today"}, tmp_path / "quality.png")
    assert (tmp_path / "quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = "\n".join(quality_section(json.loads(json.dumps(out)), tmp_path, tmp_path / "benchmarks.md"))
    assert "### auto policy frontier" in text and "Recommended: **" in text and "Skipped: the exact lane" in text
    shares = ", ".join(f"{lane} {share:.0%}" for lane, share in lanes["auto"]["served_by"].items())
    assert f"The deployed router (fast lane for difficulty at most {THRESHOLD:g}; served by {shares}): " in text


def test_lanes_flag_is_checked_before_anything_runs(capsys):
    from bench.quality import main

    for lanes, says in (("standard,turbo", "unknown lane(s) turbo"), ("fast,auto", "must include standard")):
        with pytest.raises(SystemExit):
            main(["--lanes", lanes, "--url", "http://127.0.0.1:9"])
        assert says in capsys.readouterr().err
