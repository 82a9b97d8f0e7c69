"""``auto``'s routing policy, swept offline from the quality bench's per-sample records.

The quality bench (``bench.quality``) sends every held-out prompt to every lane and keeps, per
sample, each lane's hit and measured latency (the response's ``timing.total_s``), and the prompt's
difficulty score under the router's own scorer (``serve.difficulty``) with the time that score
took. Any threshold policy "fast if score <= t, else full tier H" (fast when *easy*), or "fast if
score > t, else H" (fast when *hard*: where neither model is likely right, the cheap one answers),
can then be replayed without the server: on each sample it scores the chosen lane's hit, and costs the chosen lane's own measured
latency there plus the scoring time (the served ``auto`` pays for the score on every request).

- ``sweep``: every (t, H) on a grid: t = -1 (never fast: scores are losses, never negative), the
  score quantiles 0, 5%, ..., 100% (order statistics, so each is a sample's score and 100% sends
  every sample to fast) and any extra thresholds (the deployed one); H = each full-model tier
  measured (standard, priority, exact); both directions (fast when easy, fast when hard).
- ``frontier``: the Pareto frontier of (mean latency, exact match) over the lanes as measured and
  every policy.
- ``recommend``: a policy reaching >= 95% of standard's exact match at <= 50% of its mean latency
  (the fastest such), else the fastest policy on the frontier that keeps >= 95% of standard's exact
  match (the quality bar kept, the latency goal missed by what it says), else the frontier policy with the
  highest exact match at <= standard's mean latency. Policies within 2% of the chosen one's latency
  on a cheaper full tier (standard's price is 1, priority's and exact's 6) win the tie.

A replayed policy is what the router would do on these prompts if each lane's latency did not
depend on the others' load (the bench measures lanes one at a time, two streams each).

Usage: python -m bench.auto_policy [bench/results/quality_samples.jsonl]: the sweep again from
the records, printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from models.eval.stats import compare, pct_ci, wilson

FULL_TIERS = ("standard", "priority", "exact")
"""The lanes serving the full model, in the order policies are listed."""
PRICE = {"standard": 1.0, "priority": 6.0, "exact": 6.0}
"""The full tiers' default prices (serve.config): the tie-break between policies of equal latency."""
DIRECTIONS = ("easy", "hard")
"""Which prompts go to fast: those scored at most the threshold (easy), or above it (hard)."""
LATENCY_TIE = 0.02
"""Policies within this fraction of the chosen one's mean latency count as equally fast."""
QUANTILES = 20
"""Threshold grid: the score quantiles at 0, 1/20, ..., 1."""
NEVER_FAST = -1.0
"""A threshold below every score: the policy that sends every prompt to the full model."""
QUALITY_PCT, LATENCY_PCT = 95, 50
"""``recommend``'s first rule: at least this percentage of standard's exact match at most this
percentage of its mean latency (integers, so the exact-match test is exact on the counts)."""


@dataclass(frozen=True)
class Sample:
    """One held-out prompt as measured: its difficulty score, the seconds that score took, and per
    lane whether the lane's line was right and the lane's latency (seconds)."""

    difficulty: float
    scoring_s: float
    hit: dict[str, bool]
    latency_s: dict[str, float]

    @classmethod
    def from_record(cls, rec: dict) -> Sample:
        """From a line of ``quality_samples.jsonl``."""
        lanes = rec["lanes"]
        return cls(rec["difficulty"], rec["scoring_s"], {n: v["hit"] for n, v in lanes.items()},
                   {n: v["latency_s"] for n, v in lanes.items()})


def pareto(points: dict[str, tuple[float, float]]) -> list[str]:
    """The names on the frontier when both coordinates are better higher: no other point is at
    least as good on both and better on one (so identical points are all kept), sorted by x."""
    front = []
    for n, (x, y) in points.items():
        if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for m, (x2, y2) in points.items() if m != n):
            front.append(n)
    return sorted(front, key=lambda n: points[n][0])


def thresholds(scores: Sequence[float], quantiles: int = QUANTILES, extra: Iterable[float] = ()) -> list[float]:
    """The grid, ascending and without repeats: ``NEVER_FAST``, the score quantiles, ``extra``."""
    ordered = sorted(scores)
    grid = {NEVER_FAST, *extra}
    grid.update(ordered[round(i * (len(ordered) - 1) / quantiles)] for i in range(quantiles + 1))
    return sorted(grid)


def route(samples: Sequence[Sample], threshold: float, full_tier: str, fast_when: str = "easy") -> list[str]:
    """The lane each sample goes to under "fast if score <= threshold, else full_tier" (``fast_when``
    easy) or "fast if score > threshold, else full_tier" (hard), as ``serve.router`` routes."""
    if fast_when == "hard":
        return ["fast" if s.difficulty > threshold else full_tier for s in samples]
    return ["fast" if s.difficulty <= threshold else full_tier for s in samples]


def _point(name: str, hits: Sequence[bool], latencies: Sequence[float], **extra) -> dict:
    k, n = sum(hits), len(hits)
    return {"name": name, **extra, "mean_latency_s": statistics.fmean(latencies), "exact_match": k / n,
            "exact_match_count": k, "exact_match_ci95": list(wilson(k, n)), "samples": n}


def simulate(samples: Sequence[Sample], threshold: float, full_tier: str, fast_when: str = "easy") -> dict:
    """One policy replayed: ``name``, ``threshold``, ``full_tier``, ``fast_when``, ``fast_share``, then
    ``mean_latency_s`` (chosen lane's latency + scoring), ``exact_match``, ``exact_match_count``,
    ``exact_match_ci95`` (Wilson) and ``samples``."""
    lanes = route(samples, threshold, full_tier, fast_when)
    op = ">" if fast_when == "hard" else "<="
    return _point(f"fast if score {op} {threshold:.3f} else {full_tier}",
                  [s.hit[lane] for s, lane in zip(samples, lanes)],
                  [s.latency_s[lane] + s.scoring_s for s, lane in zip(samples, lanes)],
                  threshold=threshold, full_tier=full_tier, fast_when=fast_when,
                  fast_share=lanes.count("fast") / len(lanes))


def lane_point(samples: Sequence[Sample], lane: str, name: str | None = None) -> dict:
    """A lane as measured (its own latencies, no scoring added: a served ``auto`` scored already)."""
    return _point(name or lane, [s.hit[lane] for s in samples], [s.latency_s[lane] for s in samples], lane=lane)


def sweep(samples: Sequence[Sample], extra_thresholds: Iterable[float] = ()) -> list[dict]:
    """Every policy on the grid, for every full tier measured on all samples (none without fast)."""
    if not samples or any("fast" not in s.hit for s in samples):
        return []
    tiers = [t for t in FULL_TIERS if all(t in s.hit for s in samples)]
    grid = thresholds([s.difficulty for s in samples], extra=extra_thresholds)
    return [simulate(samples, t, tier, way) for way in DIRECTIONS for tier in tiers for t in grid]


def frontier(points: Sequence[dict]) -> list[dict]:
    """The points no other point beats on both mean latency (lower) and exact match (higher),
    fastest first; ties are all kept."""
    front = pareto({str(i): (-p["mean_latency_s"], p["exact_match"]) for i, p in enumerate(points)})
    return sorted((points[int(i)] for i in front), key=lambda p: (p["mean_latency_s"], -p["exact_match"]))


def recommend(policies: Sequence[dict], standard: dict, lanes: Sequence[dict] = ()) -> dict | None:
    """The policy to deploy, with ``rule`` saying which rule chose it and ``on_frontier`` whether no
    lane or policy beats it; ``None`` if no rule finds one. ``standard`` is the standard lane's
    measured point; ``lanes`` are the lanes' measured points (``standard`` among them).

    First rule: exact match >= 95% of standard's and mean latency <= 50% of standard's; the fastest
    (then the most exact) of those. Otherwise: among the policies on the frontier of ``lanes`` and
    ``policies``, the highest exact match at mean latency <= standard's (then the fastest). A policy
    that a lane beats (say "never fast, else priority" against the priority lane, which skips the
    score) is no routing worth deploying, so the second rule never picks one."""
    k_std, lat_std = standard["exact_match_count"], standard["mean_latency_s"]
    front = frontier([*lanes, *policies])
    on_front = {id(p) for p in front}
    good = [p for p in policies if 100 * p["exact_match_count"] >= QUALITY_PCT * k_std
            and p["mean_latency_s"] <= LATENCY_PCT / 100 * lat_std]
    if good:
        best = _cheapest_tie(good)
        return {**best, "on_frontier": id(best) in on_front,
                "rule": f">= {QUALITY_PCT}% of standard's exact match at <= {LATENCY_PCT}% of its mean latency; "
                        "the fastest such policy"}
    kept = [p for p in policies if 100 * p["exact_match_count"] >= QUALITY_PCT * k_std
            and p["mean_latency_s"] < lat_std and id(p) in on_front]
    if kept:
        best = _cheapest_tie(kept)
        return {**best, "on_frontier": id(best) in on_front,
                "rule": f"no policy reached {QUALITY_PCT}% of standard's exact match at {LATENCY_PCT}% of its "
                        f"latency; the fastest policy keeping >= {QUALITY_PCT}% of its exact match"}
    fast_enough = [p for p in front if id(p) in {id(q) for q in policies} and p["mean_latency_s"] <= lat_std]
    if not fast_enough:
        return None
    best = max(fast_enough, key=lambda p: (p["exact_match_count"], -p["mean_latency_s"]))
    return {**best, "on_frontier": True,
            "rule": f"no policy reached {QUALITY_PCT}% of standard's exact match at {LATENCY_PCT}% of its "
                    "latency; the frontier policy with the highest exact match at <= standard's mean latency"}


def _cheapest_tie(policies: Sequence[dict]) -> dict:
    """The fastest policy (then the most exact), unless one within ``LATENCY_TIE`` of its latency
    uses a cheaper full tier (then the fastest of the cheapest)."""
    best = min(policies, key=lambda p: (p["mean_latency_s"], -p["exact_match_count"]))
    close = [p for p in policies if p["mean_latency_s"] <= best["mean_latency_s"] * (1 + LATENCY_TIE)
             and p["exact_match_count"] >= best["exact_match_count"]]
    return min(close, key=lambda p: (PRICE.get(p["full_tier"], 1.0), p["mean_latency_s"], -p["exact_match_count"]))


def policy_hits(samples: Sequence[Sample], policy: dict) -> list[bool]:
    """Per sample, whether ``policy`` (a ``simulate`` result) got it right."""
    lanes = route(samples, policy["threshold"], policy["full_tier"], policy.get("fast_when", "easy"))
    return [s.hit[lane] for s, lane in zip(samples, lanes)]


def analyse(samples: Sequence[Sample], served_threshold: float | None = None) -> dict:
    """The sweep's outputs for quality.json: ``auto_policies``, ``auto_policy_frontier`` (over the
    lanes as measured, the served ``auto`` included, and every policy) and ``auto_recommended``
    (with ``vs_standard``, its paired comparison with the standard lane)."""
    extra = [] if served_threshold is None else [served_threshold]
    policies = sweep(samples, extra)
    lanes = [] if not samples else [n for n in (*FULL_TIERS, "fast", "auto") if all(n in s.hit for s in samples)]
    points = [lane_point(samples, n, "auto (served)" if n == "auto" else n) for n in lanes] + policies
    out: dict = {"auto_policies": policies, "auto_policy_frontier": frontier(points), "auto_recommended": None}
    if policies and "standard" in lanes:
        rec = recommend(policies, points[lanes.index("standard")], points[:len(lanes)])
        if rec is not None:
            rec["vs_standard"] = compare(policy_hits(samples, rec), [s.hit["standard"] for s in samples])
        out["auto_recommended"] = rec
    return out


def summary(result: dict) -> list[str]:
    """Printable lines: the frontier, then the recommended policy."""
    lines = ["auto policy frontier (mean latency, exact match [95% CI]):"]
    for p in result["auto_policy_frontier"]:
        lines.append(f"  {p['mean_latency_s'] * 1e3:7.0f} ms  {pct_ci(p['exact_match_count'], p['samples']):<22} "
                     f"{p['name']}" + (f" (fast {p['fast_share']:.0%})" if "fast_share" in p else ""))
    rec = result["auto_recommended"]
    if rec is None:
        lines.append("auto_recommended: none (no policy measured, or none on the frontier as fast as standard)")
    else:
        v = rec["vs_standard"]
        lines.append(f"auto_recommended: {rec['name']} (fast {rec['fast_share']:.0%}): "
                     f"{pct_ci(rec['exact_match_count'], rec['samples'])} exact match at "
                     f"{rec['mean_latency_s'] * 1e3:.0f} ms; vs standard {100 * v['difference']:+.1f} pts, "
                     f"McNemar p={v['mcnemar_exact_p']:.2g}; rule: {rec['rule']}")
    return lines


def load(path: Path) -> list[Sample]:
    """The records of a ``quality_samples.jsonl``."""
    return [Sample.from_record(json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.auto_policy", description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="?", type=Path, default=Path("bench/results/quality_samples.jsonl"))
    ap.add_argument("--served-threshold", type=float, help="also replay this threshold (the deployed one)")
    args = ap.parse_args(argv)
    print("\n".join(summary(analyse(load(args.records), args.served_threshold))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
