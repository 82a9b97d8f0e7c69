"""``bench.quality.Journal``: a quality run cut short goes on where it stopped. With a fake server
(no app, no model): a run that fails partway, then a second run on the same journal, sends only
the requests the first did not finish and measures what one uninterrupted run measures."""

from __future__ import annotations

import json

import pytest

from bench.quality import LANES, PROBE_PROMPT, Journal, ServedLane, measure_v2
from tests.bench.test_quality_v2 import COUNTS, RightServer, fake_score


class Cut(RuntimeError):
    """The first run's end (a sitting stopped mid-stage)."""


class CutServer(RightServer):
    """``RightServer`` that fails its ``cut_at``-th eval request (the probes not counted)."""

    def __init__(self, cut_at: int | None = None) -> None:
        super().__init__()
        self.cut_at, self.sent = cut_at, []

    async def create(self, *, model, service_tier, input, **params):
        if input != PROBE_PROMPT:
            self.sent.append((model, service_tier, repr(input)))
            if len(self.sent) == self.cut_at:
                raise Cut("the sitting ended")
        return await super().create(model=model, service_tier=service_tier, input=input, **params)


def lanes_on(server: RightServer, journal: Journal | None) -> list[ServedLane]:
    return [ServedLane(n, "ws://fake", None, lambda texts: [1.0] * len(texts), connect=server.connect,
                       journal=journal) for n in LANES]


def test_a_run_cut_short_resumes_from_its_journal_and_measures_what_one_run_does(tmp_path, capsys):
    whole = CutServer()
    expected, expected_records = measure_v2(lanes_on(whole, None), fake_score, COUNTS, max_files=3)
    per_lane = sum(COUNTS.values())
    assert len(whole.sent) == len(LANES) * per_lane

    journal = Journal(tmp_path)
    first = CutServer(cut_at=2 * per_lane + 5)  # standard and priority done, exact partway
    with pytest.raises(Cut):
        measure_v2(lanes_on(first, journal), fake_score, COUNTS, max_files=3)
    kept = {lane: len(journal.path(lane).read_text().splitlines()) for lane in LANES if journal.path(lane).exists()}
    assert kept["standard"] == kept["priority"] == per_lane and 5 <= kept["exact"] < per_lane
    assert "fast" not in kept and "auto" not in kept

    second = CutServer()
    out, records = measure_v2(lanes_on(second, journal), fake_score, COUNTS, max_files=3)
    assert len(second.sent) == len(LANES) * per_lane - sum(kept.values())  # nothing sent twice
    assert not any(m == "fastmode-full" and t in ("default", "priority") for m, t, _ in second.sent)
    answered = first.sent[:first.cut_at - 1] + first.sent[first.cut_at:]  # all but the one that failed
    assert sorted(answered + second.sent) == sorted(whole.sent)  # every request answered once
    # what the lanes answered, how each scored and how fast: as one run's (the scorer's own timing,
    # and the replayed auto policies that add it, are measured afresh by each run)
    assert out["lanes"] == expected["lanes"] and out["agreement_with_standard"] == expected["agreement_with_standard"]
    assert [{**r, "scoring_s": None} for r in records] == [{**r, "scoring_s": None} for r in expected_records]
    assert "the exact lane's journal holds" in capsys.readouterr().err


def test_a_journal_line_of_another_request_or_cut_mid_write_is_dropped(tmp_path):
    journal = Journal(tmp_path)
    calls = [{"model": "fastmode-full", "input": f"q{i}", "max_output_tokens": 4} for i in range(3)]

    class R:
        id, text, lane, route = "r", "an answer", "standard", None
        timing = type("T", (), {"total_s": 0.5, "decode_tokens_per_s": 20.0})

    journal.add("standard", 0, calls[0], R)
    journal.add("standard", 1, {**calls[1], "max_output_tokens": 8}, R)  # the request at 1 is another now
    with journal.path("standard").open("a") as f:
        f.write(json.dumps({"i": 2, "key": Journal.key(calls[2])})[:20])  # cut off mid-write
    got = journal.load("standard", calls)
    assert got[1] is None and got[2] is None
    assert (got[0].text, got[0].lane, got[0].timing.total_s, got[0].timing.decode_tokens_per_s) == (
        "an answer", "standard", 0.5, 20.0)
    assert len(journal.path("standard").read_text().splitlines()) == 1  # rewritten with what it kept
    journal.remove()
    assert not list(tmp_path.iterdir())
