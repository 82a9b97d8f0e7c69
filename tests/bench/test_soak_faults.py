"""``fastmode bench soak --kill``: how the requests in flight at a kill are judged (issue 18's contract:
a retryable error within 5 s, or a normal end; the lane serving again within 30 s). The kill itself
runs on a live application in ``tests/serve/test_faults.py``; here the judgement, on ledgers."""

from __future__ import annotations

from bench.soak import Ledger, judge_kill


def ledger_with(ends: dict[str, tuple[str | None, float, float | None]], killed_at: float = 100.0) -> Ledger:
    """A ledger whose requests ended as ``{rid: (end, seconds after the kill, retry_after)}``."""
    led = Ledger()
    for rid, (end, after, retry) in ends.items():
        led.start(rid, "ws", "fast", 16)
        led.requests[rid].update(lane="fast", end=end, end_at=killed_at + after, retry_after=retry)
    return led


def fault(rids, served_again_s: float | None = 12.0) -> dict:
    return {"kill": "chip", "lane": "fast", "pid": 1, "killed_at": 100.0, "in_flight": list(rids),
            "served_again_s": served_again_s, "refusals_meanwhile": {"lane_unavailable": 3}}


def test_retryable_errors_in_time_and_a_lane_back_in_time_pass():
    led = ledger_with({"a": ("error:lane_unavailable", 0.4, 1.0), "b": ("completed", 0.01, None),
                       "c": ("cancelled", 0.2, None)})
    got = judge_kill(fault("abc"), led)
    assert got["ok"] and got["in_flight_at_kill"] == 3 and got["latest_error_s"] == 0.4
    assert got["their_ends"] == {"error:lane_unavailable": 1, "completed": 1, "cancelled": 1}


def test_a_late_error_an_unretryable_one_a_lost_request_or_a_lane_not_back_fail():
    late = ledger_with({"a": ("error:lane_unavailable", 6.0, 1.0)})
    assert not judge_kill(fault("a"), late)["ok"]
    no_hint = ledger_with({"a": ("error:lane_unavailable", 0.5, None)})
    assert not judge_kill(fault("a"), no_hint)["ok"]
    other = ledger_with({"a": ("error:internal_error", 0.5, 1.0)})
    assert not judge_kill(fault("a"), other)["ok"]
    lost = ledger_with({"a": (None, 0.0, None)})
    assert judge_kill(fault("a"), lost)["their_ends"] == {"none": 1} and not judge_kill(fault("a"), lost)["ok"]
    fine = ledger_with({"a": ("error:lane_unavailable", 0.5, 1.0)})
    assert not judge_kill(fault("a", served_again_s=None), fine)["ok"]
    assert not judge_kill(fault("a", served_again_s=31.0), fine)["ok"]


def test_no_process_to_kill_fails_and_says_so():
    got = judge_kill({"kill": "engine", "lane": "standard", "error": "no such process"}, Ledger())
    assert not got["ok"] and got["error"] == "no such process"
