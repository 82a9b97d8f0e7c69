"""The offline sweep of ``auto``'s threshold policy, on a table small enough to check by hand."""

from __future__ import annotations

import pytest

from bench.auto_policy import NEVER_FAST, Sample, analyse, frontier, recommend, simulate, sweep, thresholds
from models.eval.stats import wilson

T, F = True, False
FAST_S, STD_S, PRIO_S, SCORE_S = 0.125, 1.0, 0.5, 0.0625


def table(with_priority: bool = True) -> list[Sample]:
    """Four prompts of difficulty 1..4. fast is right on 1 and 4; standard (and priority, the same
    weights) on 1, 2 and 4; nobody on 3. Latencies: fast 0.125 s, priority 0.5, standard 1.0;
    scoring 0.0625."""
    fast, full = [T, F, F, T], [T, T, F, T]
    out = []
    for i in range(4):
        hit, lat = {"fast": fast[i], "standard": full[i]}, {"fast": FAST_S, "standard": STD_S}
        if with_priority:
            hit["priority"], lat["priority"] = full[i], PRIO_S
        out.append(Sample(difficulty=float(i + 1), scoring_s=SCORE_S, hit=hit, latency_s=lat))
    return out


def test_a_policy_by_hand():
    p = simulate(table(), 2.0, "standard")  # prompts 1, 2 -> fast (T, F); 3, 4 -> standard (F, T)
    assert p["fast_share"] == 0.5 and p["exact_match_count"] == 2 and p["exact_match"] == 0.5
    assert p["mean_latency_s"] == pytest.approx((2 * FAST_S + 2 * STD_S) / 4 + SCORE_S)  # 0.625
    assert p["exact_match_ci95"] == list(wilson(2, 4))
    never = simulate(table(), NEVER_FAST, "priority")
    assert (never["fast_share"], never["exact_match_count"]) == (0.0, 3)
    assert never["mean_latency_s"] == pytest.approx(PRIO_S + SCORE_S)
    always = simulate(table(), 4.0, "standard")
    assert (always["fast_share"], always["exact_match_count"]) == (1.0, 2)
    assert always["mean_latency_s"] == pytest.approx(FAST_S + SCORE_S)


def test_the_grid_and_the_sweep():
    assert thresholds([3.0, 1.0, 4.0, 2.0]) == [NEVER_FAST, 1.0, 2.0, 3.0, 4.0]
    assert thresholds([1.0, 2.0], extra=[1.5, 2.0]) == [NEVER_FAST, 1.0, 1.5, 2.0]
    policies = sweep(table())
    assert [(p["fast_when"], p["full_tier"], p["threshold"]) for p in policies] == [
        (way, tier, t) for way in ("easy", "hard") for tier in ("standard", "priority")
        for t in (NEVER_FAST, 1.0, 2.0, 3.0, 4.0)]
    hard = simulate(table(), 2.0, "standard", "hard")  # prompts 3, 4 -> fast (F, T); 1, 2 -> standard (T, T)
    assert hard["name"] == "fast if score > 2.000 else standard" and hard["exact_match_count"] == 3
    assert sweep([Sample(1.0, 0.0, {"standard": T}, {"standard": 1.0})]) == []  # no fast lane: nothing to route


def test_frontier_and_recommendation_by_hand():
    result = analyse(table())
    # The fast lane (0.125 s, 2/4) beats every policy with 2 hits; "fast if score > 2 else priority"
    # (prompts 3 and 4 to fast, where full is no better: 0.375 s, 3/4) beats the priority lane itself
    # (0.5 s, 3/4) and everything slower.
    assert [p["name"] for p in result["auto_policy_frontier"]] == ["fast", "fast if score > 2.000 else priority"]
    rec = result["auto_recommended"]
    assert (rec["threshold"], rec["full_tier"], rec["fast_when"]) == (2.0, "priority", "hard")
    assert rec["mean_latency_s"] == pytest.approx((2 * FAST_S + 2 * PRIO_S) / 4 + SCORE_S)  # <= 0.5 * 1.0
    assert rec["rule"].startswith(">= 95% of standard's exact match") and rec["on_frontier"]
    assert rec["vs_standard"]["difference"] == 0 and not rec["vs_standard"]["significant"]


def test_recommendation_falls_back_to_the_best_policy_no_slower_than_standard():
    # Without priority nothing reaches 3/4 at half of standard's 1 s; the fastest frontier policy
    # keeping 3/4 is "fast if score > 2 else standard": 3/4 at 0.625 s.
    result = analyse(table(with_priority=False))
    rec = result["auto_recommended"]
    assert (rec["threshold"], rec["full_tier"], rec["exact_match_count"]) == (2.0, "standard", 3)
    assert rec["mean_latency_s"] == pytest.approx((2 * FAST_S + 2 * STD_S) / 4 + SCORE_S)
    assert rec["rule"].startswith("no policy reached 95%") and "keeping" in rec["rule"]
    standard = {"exact_match_count": 3, "mean_latency_s": 0.01}
    assert recommend(result["auto_policies"], standard) is None  # none as fast as a 10 ms standard


def test_the_fallback_never_picks_a_policy_a_lane_beats():
    # Fast never right: "never fast, else priority" (3/4 at 0.5625 s) has the most exact match of
    # the policies at <= standard's 1 s, but it is the priority lane (3/4 at 0.5 s) plus the
    # score's time. On the frontier of lanes and policies, the most exact policy is "fast if
    # score > 2, else priority": 2/4 at 0.375 s, faster than the priority lane.
    samples = [Sample(s.difficulty, s.scoring_s, {**s.hit, "fast": False}, s.latency_s) for s in table()]
    lanes = [{"name": n, "mean_latency_s": lat, "exact_match": 0.75 if n != "fast" else 0.0,
              "exact_match_count": 3 if n != "fast" else 0, "samples": 4}
             for n, lat in (("standard", STD_S), ("priority", PRIO_S), ("fast", FAST_S))]
    policies = sweep(samples)
    assert recommend(policies, lanes[0]) is not None  # without the lanes, "never fast, else priority" wins
    assert recommend(policies, lanes[0])["threshold"] == NEVER_FAST
    rec = recommend(policies, lanes[0], lanes)
    assert (rec["threshold"], rec["full_tier"], rec["exact_match_count"]) == (2.0, "priority", 2)
    assert rec["mean_latency_s"] == pytest.approx((2 * FAST_S + 2 * PRIO_S) / 4 + SCORE_S)


def test_frontier_keeps_ties_and_drops_the_dominated():
    pts = [{"name": "a", "mean_latency_s": 0.2, "exact_match": 0.05},
           {"name": "b", "mean_latency_s": 0.2, "exact_match": 0.05},  # a and b tie: both stay
           {"name": "c", "mean_latency_s": 0.2, "exact_match": 0.04},  # as fast as a, worse
           {"name": "d", "mean_latency_s": 0.1, "exact_match": 0.03},
           {"name": "e", "mean_latency_s": 0.3, "exact_match": 0.05}]  # as good as a, slower
    assert [p["name"] for p in frontier(pts)] == ["d", "a", "b"]
