"""``bench.quality.measure_v2`` with a fake server (no app, no model): the v2 eval through every
lane, its per-sample records as ``bench.auto_policy`` reads them, and the comparisons with standard."""

from __future__ import annotations

from contextlib import asynccontextmanager
from types import SimpleNamespace

from bench.auto_policy import Sample
from bench.quality import LANES, ServedLane, measure_v2
from models.eval import suite
from models.eval.stats import wilson

COUNTS = {"humaneval": 2, "next_line": 4, "tasks": 9}
LATENCY = {"standard": 0.2, "priority": 0.1, "exact": 0.15, "fast": 0.02}


def key(prompt) -> str:
    return prompt if isinstance(prompt, str) else repr([(m["role"], m["content"]) for m in prompt])


def fake_score(prompt) -> float:
    text = prompt if isinstance(prompt, str) else prompt.joined()
    return (len(text) % 7) / 2


class RightServer:
    """The full model's lanes give the ground truth (HumanEval's canonical solution, the true line
    without its indentation hint, the answer), the fast lane an empty reply, auto routes by length."""

    def __init__(self):
        items = suite.build(COUNTS, seed=0, held=suite.held_out_files(3))
        self.right = {key(it.request.prompt): it.reference[len(suite.indent_hint(it.reference)):]
                      if it.task == "next_line" else it.reference for it in items}
        self.responses = SimpleNamespace(create=self.create)
        self.seen = []

    async def create(self, *, model, service_tier, input, **params):
        lane = next(n for n, (m, t) in LANES.items() if (m, t) == (model, service_tier))
        assert len(params.get("stop") or []) <= 4, params["stop"]  # the server refuses more (serve.request)
        self.seen.append((lane, input, params))
        route = None
        if lane == "auto":
            text = input if isinstance(input, str) else "\n".join(m["content"] for m in input)
            score = (len(text) % 7) / 2
            route = {"by": "auto", "difficulty": score, "threshold": 1.5}
            lane = "fast" if score <= 1.5 else "standard"
        text = "" if lane == "fast" else self.right.get(key(input), "?") + "\ndef more(): past every stop"
        timing = SimpleNamespace(total_s=LATENCY[lane], decode_tokens_per_s=1 / LATENCY[lane])
        return SimpleNamespace(text=text, lane=lane, timing=timing, route=route)

    def connect(self):
        @asynccontextmanager
        async def client():
            yield self

        return client()


def test_measure_v2_through_every_lane():
    server = RightServer()
    lanes = [ServedLane(n, "ws://fake", None, lambda texts: [1.0] * len(texts), connect=server.connect) for n in LANES]
    out, records = measure_v2(lanes, fake_score, COUNTS, max_files=3)
    n = sum(COUNTS.values())
    assert out["suite"] == "v2" and out["samples"] == n == len(records) and out["counts"] == COUNTS
    std = out["lanes"]["standard"]
    # Next lines and HumanEval are cut at their stops; the tasks' replies are graded whole (they have
    # no stop strings, so the extra line after a right answer does not hurt).
    assert std["exact_match_count"] == n and std["tasks"]["humaneval"]["hits"] == 2
    assert out["lanes"]["fast"]["exact_match_count"] == 0
    assert out["lanes"]["fast"]["vs_standard"]["b_only_hits"] == n
    for name, v in out["lanes"].items():
        hits = [r["lanes"][name]["hit"] for r in records]
        assert v["exact_match_count"] == sum(hits) and v["exact_match_ci95"] == list(wilson(sum(hits), n))
    auto_hits = sum(r["lanes"]["auto"]["hit"] for r in records)
    assert auto_hits == sum(r["lanes"]["auto"]["served_by"] == "standard" for r in records)
    assert out["auto_served"]["routing_agreement_with_offline_scorer"] == 1.0
    assert all(Sample.from_record(r).hit["standard"] for r in records)  # auto_policy reads the records
    assert out["auto_recommended"] is not None and out["baseline"]["tasks"]["humaneval"]["hits"] == 0
    chats = [i for lane, i, _ in server.seen if lane == "standard" and isinstance(i, list)]
    assert len(chats) == COUNTS["tasks"]  # the questions go as chat messages (the probe is a string)
