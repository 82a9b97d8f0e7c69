"""``docs/benchmarks.md`` from one run's results (``bench/results/*.json``, written by
``fastmode bench all``): nothing in it is typed by hand; every figure comes from a JSON file of
that run, and the header names the command, date, machine and commit.

Usage: python -m bench.report [--results bench/results] [--out docs/benchmarks.md] [--readme README.md]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from bench.app import REPO
from bench import headline
from bench.headline import llama_cpp_ratios
from bench.lanes import PUBLISHED, PUBLISHED_BY
from models.eval.stats import diff_text, pct_ci


ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])/(?:[\w.+@-]+/)*[\w.+@-]+")
"""An absolute path in recorded text (a command's ``--out /x/bench/results``); not a URL's path."""
MACHINE_ROOTS = {"work", "root", "home", "tmp", "usr", "opt", "var", "mnt", "srv", "data", "scratch", "private",
                 "Users", "nix"}
"""First components of a path on the machine that ran a benchmark (not an API route like ``/v1/door``)."""


def shown(results: Path) -> str:
    """The results directory as the report names it: relative to the repository, else ``OUT``."""
    try:
        return Path(results).resolve().relative_to(REPO).as_posix()
    except ValueError:
        return "OUT"


def relative(text: str, results: Path) -> str:
    """``text`` with each machine path made relative: one under the results directory starts with
    ``shown(results)``; one in this repository, or in another checkout of it (the machine the
    benchmark ran on), starts at the repository's root; any other keeps only its name."""
    results = Path(results).resolve()
    top = {p.name for p in REPO.iterdir()}

    def one(m: re.Match) -> str:
        path = Path(m.group(0))
        for root, label in ((results, shown(results)), (REPO, ".")):
            if path.is_relative_to(root):
                return (Path(label) / path.relative_to(root)).as_posix()
        parts = path.parts[1:]
        if parts[0] not in MACHINE_ROOTS:
            return m.group(0)
        i = next((i for i, part in enumerate(parts) if part in top), None)
        return "/".join(parts[i:]) if i is not None else parts[-1]

    return ABSOLUTE_PATH.sub(one, text)


def _relative(x: Any, results: Path) -> Any:
    if isinstance(x, str):
        return relative(x, results)
    if isinstance(x, list):
        return [_relative(v, results) for v in x]
    if isinstance(x, dict):
        return {k: _relative(v, results) for k, v in x.items()}
    return x


def _load(results: Path, name: str) -> dict | None:
    """A result file, every string in it with its machine paths made relative (``relative``)."""
    path = results / name
    return _relative(json.loads(path.read_text()), results) if path.exists() else None


def _f(x: Any, fmt: str = "{:.1f}") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt.format(x)


def _ms(seconds: float | None) -> str:
    return _f(seconds and seconds * 1e3, "{:.0f}")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(r) + " |" for r in rows)]


def _image(results: Path, docs: Path, name: str, alt: str) -> list[str]:
    path, home = (results / name).resolve(), docs.resolve().parent
    if not path.exists():
        return []
    # a link relative to the report where both lie in one tree; else the file as the report names it
    near = path.is_relative_to(home) or (path.is_relative_to(REPO) and home.is_relative_to(REPO))
    return [f"![{alt}]({os.path.relpath(path, home) if near else relative(str(path), results)})", ""]


def _sittings(suite: dict) -> str:
    """``, in N sittings (...)`` for a run continued with ``--resume``: when each started, at which
    commits, which stages may span them, and the machine's speed at each start
    (``bench.machine_speed``, where the run has it); ``""`` for a run in one sitting."""
    if len(suite.get("sittings", ())) < 2:
        return ""
    commits = suite.get("sitting_commits", ())
    text = f", in {len(suite['sittings'])} sittings (`--resume`: started {', '.join(suite['sittings'])}"
    text += (f", at commits {', '.join('`' + (c or '?')[:12] + '`' for c in commits)} of the same measured code "
             "(they differ only in docs, tests and results)" if len(set(commits)) > 1 else ", every one at this commit")
    if "sitting_speeds" not in suite:  # a run before bench.quality.Journal
        return text + "; each stage ran whole in one of them)"
    text += "; each stage but `quality` ran whole in one of them (`quality` goes on from where a sitting stopped it)"
    speeds = [s["gb_per_s"] if s else None for s in suite["sitting_speeds"]]
    if any(speeds):
        text += ("; the machine's speed at each sitting's start (`python -m bench.machine_speed`): "
                 + ", ".join("?" if v is None else f"{v:.2f} GB/s" for v in speeds))
    return text + ")"


def header(suite: dict | None) -> list[str]:
    if suite is None:
        return ["No `suite.json` in the results: these files were not written by one `fastmode bench all` run.", ""]
    m, c = suite["machine"], suite["commit"]
    mem = f"{m['memory_bytes'] / 2**30:.0f} GiB" if m.get("memory_bytes") else "?"
    lines = [f"Generated from one run of `{suite['command'].strip()}` (`make bench`) on {suite['date']} "
             f"({suite['elapsed_s'] / 60:.1f} min), commit `{(c.get('sha') or '?')[:12]}`"
             f"{' (with uncommitted changes)' if c.get('dirty') else ''}"
             + _sittings(suite) + ".", "",
             f"Machine: {m.get('cpu') or '?'}, {m['cpu_count']} cores, {mem} memory, no GPU "
             f"({m['platform']}, Python {m['python']}).", ""]
    if suite.get("complete") is False:
        lines += ["**Incomplete run**: it stopped before its last stage (`fastmode bench all --resume` "
                  "continues it); the sections below hold what it measured so far.", ""]
    if suite.get("quick"):
        lines += ["**Quick run** (`--quick`): tiny settings, to check the benchmarks work; the figures "
                  "say nothing about speed.", ""]
    if suite.get("niceness"):
        n = suite["niceness"]
        lines += [f"Every stage but sharding ran at niceness {n['measuring_stages']}, the niceness Ray gives its "
                  f"workers ({n['ray_workers']}: Serve's proxy, the replicas, their vLLM engines), so the load "
                  "generator on the same machine competes with the server it measures on equal terms; vLLM's "
                  "own server, started by its stage, ran at the same niceness.", ""]
    speeds = any("machine_gb_per_s_after" in s for s in suite["stages"].values())
    rows = [[name, f"`{s['command']}`" if s.get("command") else "-", f"{s['seconds']:.0f}",
             "ok" if s["exit_code"] == 0 else f"**failed ({s.get('error') or s['exit_code']})**"]
            + ([str(s.get("sitting", "?")), f"{s['machine_gb_per_s_after']:.2f}" if "machine_gb_per_s_after" in s
                else "?"] if speeds else [])
            for name, s in suite["stages"].items()]
    app = suite.get("app") or {}
    if app.get("error"):
        lines += [f"The application did not start: {app['error'].splitlines()[0]}", ""]
    elif app.get("started_here"):
        alone = ("it started while the stages without an app ran (quick runs only)" if suite.get("quick")
                 else "alone on the machine; stages ran one after another")
        lines += [f"The application: `fastmode up` with the embedded default config, started by the run "
                  f"(ready in {app['start_s']:.0f} s), {alone}.", ""]
    heads = ["stage", "command", "seconds", "result"] + (["sitting", "machine GB/s after"] if speeds else [])
    return lines + _table(heads, rows) + [""]


def workload(settings: dict) -> str:
    """``, chat: "..."`` / ``, completion of "..."``: what a load run sent (``bench.targets``; a run
    before workloads sent the completion prompt)."""
    kind, prompt = settings.get("workload", "completion"), settings.get("prompt", "")
    shown = json.dumps(prompt)
    return f", chat: one user message {shown} through the chat template" if kind == "chat" else \
        f", completion of {shown}"


def lanes_section(doc: dict | None, results: Path, docs: Path) -> list[str]:
    out = ["## 1. Lanes under load", ""]
    if doc is None:
        return out + ["Not run.", ""]
    s = doc["settings"]
    out += [f"Closed loop over {s['connection']}: each of N streams sends `{s['max_output_tokens']}`-token "
            f"greedy requests (`ignore_eos`{workload(s)}) back to back, {s['requests_per_stream']} each"
            + (f" (more at low concurrency: at least {s['min_requests_per_level']} per level)"
               if s.get("min_requests_per_level") else "") + "; priority "
            "rejections wait `retry_after` and retry (never spilled). Chips per lane: "
            + ", ".join(f"{k} {v}" for k, v in doc["assumptions"]["chips"].items()) + " (" +
            doc["assumptions"]["chips_rule"].split(". Read")[0] + ").", ""]
    rows = []
    for lane, levels in doc["lanes"].items():
        for r in levels:
            u, t = r["per_user_decode_tokens_per_s"], r["ttft_s"]
            rows.append([lane, str(r["concurrency"]), str(r["completed"]),
                         _f(r["rejection_rate"] and 100 * r["rejection_rate"], "{:.0f}%") if r["rejection_rate"]
                         is not None else "-", _f(u["p50"]), _f(u["p10"]), _ms(t["p50"]), _ms(t["p99"]),
                         _f(r["aggregate_tokens_per_s"], "{:.0f}"), _f(r["chip_seconds_per_1k_output_tokens"], "{:.2f}"),
                         _f(r["cost_units_per_1k_output_tokens"], "{:.2f}")])
    out += _table(["lane", "streams", "done", "rejected", "per-user tok/s p50", "p10", "TTFT p50 ms", "p99 ms",
                   "aggregate tok/s", "chip-s per 1k tok", "price units per 1k tok"], rows) + [""]
    failed = [f"{lane} at {r['concurrency']} streams: {r['errors']}" for lane, levels in doc["lanes"].items()
              for r in levels if r["errors"]]
    if failed:
        out += ["Failed attempts, sent again (not in the figures): " + "; ".join(failed) + ".", ""]
    h = doc["headline"]
    if "standard_saturating_concurrency" in h:
        out += [f"Against standard at its saturating load ({h['standard_saturating_concurrency']} streams, "
                f"{_f(h['standard_at_saturation']['per_user_decode_tokens_per_s_p50'])} tok/s per user):", ""]
        out += _table(["ratio", "measured", "published"], [
            ["priority per-user speed", _f(h.get("priority_per_user_speed_ratio"), "{:.2f}x"),
             f"{PUBLISHED['priority_per_user_speed']:g}x ({PUBLISHED_BY['priority_per_user_speed']})"],
            ["priority cost (chip-seconds per 1k tokens)", _f(h.get("priority_cost_ratio"), "{:.2f}x"),
             f"{PUBLISHED['priority_cost']:g}x the price ({PUBLISHED_BY['priority_cost']})"],
            ["priority price (the server's cost units)", _f(h.get("priority_price_ratio"), "{:.2f}x"),
             f"{PUBLISHED['priority_cost']:g}x the price ({PUBLISHED_BY['priority_cost']})"],
            ["fast per-user speed", _f(h.get("fast_per_user_speed_ratio"), "{:.2f}x"),
             f"{PUBLISHED['fast_per_user_speed']:g}x ({PUBLISHED_BY['fast_per_user_speed']})"],
            ["fast per-user speed at standard's saturating load",
             _f(h.get("fast_per_user_speed_ratio_at_equal_load"), "{:.2f}x"), "-"],
            ["fast cost (chip-seconds per 1k tokens)", _f(h.get("fast_cost_ratio"), "{:.2f}x"), "-"],
            ["exact per-user speed (the full model's own output)", _f(h.get("exact_per_user_speed_ratio"), "{:.2f}x"),
             "- (no lab ships it)"],
            ["exact per-user speed over priority's", _f(h.get("exact_per_user_speed_vs_priority"), "{:.2f}x"),
             "- (the exact lane's goal: 2x)"],
            ["exact cost (chip-seconds per 1k tokens)", _f(h.get("exact_cost_ratio"), "{:.2f}x"), "-"]]) + [""]
        spec = h.get("exact_speculative_at_lowest_level")
        if spec:
            out += [f"The exact lane at {h['exact_concurrency_for_speed']} stream(s): the fast model drafted "
                    f"{spec['draft_tokens']} tokens per verify step, the full model accepted "
                    f"{_f(spec['acceptance_rate'], '{:.0%}')} of them: {_f(spec['tokens_per_step'], '{:.2f}')} "
                    f"tokens per verify step over {spec['verify_steps']} steps of {spec['requests']} requests.", ""]
    return out + _image(results, docs, "lanes_load.png", "lanes under load") + [
        f"On this machine every lane's chips are the same {doc['machine']['cpu_count']} CPU cores, so the fast "
        "lane's small model cannot "
        "show the speed of a model resident in fast memory on its own chips; on GPUs each lane has its own.", ""]


def quality_section(doc: dict | None, results: Path, docs: Path) -> list[str]:
    out = ["## 2. Quality against speed", ""]
    if doc is None:
        return out + ["Not run.", ""]
    if doc.get("suite") == "v2":
        return out + quality_v2_section(doc, results, docs)
    n = doc["samples"]
    out += [f"{n} held-out next-line questions through each lane (WebSocket, greedy, stop at the "
            f"line end, 2 streams at a time); bits per byte on {doc['held_out_files']} held-out files under the "
            "weights each lane serves (auto: the model its router picks per text). Exact match with its Wilson "
            "95% interval; against standard on the same questions: the difference in points with its paired "
            "bootstrap 95% interval and the exact McNemar p (below 0.05: more than chance).", ""]
    rows = [[name, f"{pct_ci(v['exact_match_count'], n)} ({v['exact_match_count']})",
             diff_text(v["vs_standard"]) if v.get("vs_standard") else "-", _f(v["bits_per_byte"], "{:.3f}"),
             _f(v["per_user_tokens_per_s_p50"], "{:.0f}"), _ms(v["mean_latency_s"]),
             ", ".join(f"{k} {x:.0%}" for k, x in v["served_by"].items())] for name, v in doc["lanes"].items()]
    out += _table(["lane", "exact match [95% CI] (hits)", "vs standard [95% CI], McNemar p", "bits/byte",
                   "per-user tok/s p50", "mean latency ms", "served by"], rows)
    return out + _frontier(doc, "exact match") + _quality_close(doc, results, docs)


def _frontier(doc: dict, measure: str) -> list[str]:
    """The Pareto frontier, the fast lane's retention and every lane's agreement with standard."""
    retention = doc.get("fast_quality_retention")
    return ["", f"Pareto frontier (speed, {measure}): {', '.join(doc['pareto_frontier'])}. The fast lane keeps "
            f"**{_f(None if retention is None else 100 * retention, '{:.0f}%')}** of standard's {measure}. "
            "Agreement with standard's answers: "
            + ", ".join(f"{k} {v:.0%}" for k, v in doc["agreement_with_standard"].items()) + ".", ""]


def _quality_close(doc: dict, results: Path, docs: Path) -> list[str]:
    """What both evals' sections end with: skipped lanes, the run's note, auto's policy sweep, the plot."""
    out = []
    for name, why in (doc.get("skipped_lanes") or {}).items():
        out += [f"Skipped: the {name} lane ({why}).", ""]
    if doc.get("note"):
        out += [f"Note: {doc['note']}", ""]
    return out + auto_policy_section(doc) + _image(results, docs, "quality.png", "quality against speed")


TASK_SETS = {"humaneval": "HumanEval (pass@1, run in a sandbox)", "next_line": "next line (exact match)",
             "tasks": "generated questions (checked answers)"}


def _task(t: dict | None) -> str:
    return "-" if not t else pct_ci(t["hits"], t["samples"])


def quality_v2_section(doc: dict, results: Path, docs: Path) -> list[str]:
    """Eval v2 (``models.eval.suite``): every lane's pooled score and each task set's, against standard."""
    n, counts = doc["samples"], doc.get("counts", {})
    sets = [k for k in TASK_SETS if counts.get(k)]
    out = [f"Eval v2 (`models.eval.suite`, docs/quality-eval.md): {n} questions through each lane (WebSocket, "
           "chat template, greedy, 2 streams at a time): "
           + ", ".join(f"{counts[k]} {TASK_SETS[k]}" for k in sets) + ". Scores with their Wilson 95% "
           "intervals; against standard on the same questions: the difference in points with its paired "
           "bootstrap 95% interval and the exact McNemar p (below 0.05: more than chance).", ""]
    rows = [[name, f"{pct_ci(v['exact_match_count'], n)} ({v['exact_match_count']})",
             *(_task(v.get("tasks", {}).get(k)) for k in sets),
             diff_text(v["vs_standard"]) if v.get("vs_standard") else "-",
             _f(v["per_user_tokens_per_s_p50"], "{:.0f}"), _ms(v["mean_latency_s"]),
             ", ".join(f"{k} {x:.0%}" for k, x in v["served_by"].items())] for name, v in doc["lanes"].items()]
    base = doc.get("baseline")
    if base:
        rows.append([base["name"], f"{pct_ci(base['all']['hits'], base['all']['samples'])} ({base['all']['hits']})",
                     *(_task(base.get("tasks", {}).get(k)) for k in sets), "-", "-", "-", "-"])
    out += _table(["lane", "score [95% CI] (hits)", *(TASK_SETS[k] for k in sets), "vs standard [95% CI], McNemar p",
                   "per-user tok/s p50", "mean latency ms", "served by"], rows)
    out += _frontier(doc, "score")
    out += [f"- {TASK_SETS[k]}: {why}." for k, why in (doc.get("training_data") or {}).items() if k in sets] + [""]
    return out + _quality_close(doc, results, docs)


def auto_policy_section(doc: dict) -> list[str]:
    """The offline sweep of ``auto``'s threshold policy (``bench.auto_policy``): its frontier and pick."""
    front = doc.get("auto_policy_frontier")
    if not front:
        return []
    s = doc.get("difficulty_scoring") or {}
    out = ["### auto policy frontier", "",
           f"Every lane answered every question, so each policy \"fast if the router's difficulty score <= t, "
           f"else tier H\" is replayed offline ({len(doc['auto_policies'])} policies: t over the score quantiles, "
           "H over the full-model tiers): per question, the chosen lane's measured latency plus the score's "
           f"own time (mean {_f(s.get('mean_s') and 1e3 * s['mean_s'], '{:.2f}')} ms here) and that lane's hit. "
           "The frontier of mean latency against exact match, over the lanes as measured and every policy:", ""]
    rows = [[p["name"], p.get("full_tier", "-"), _f(p.get("threshold"), "{:.3f}"),
             f"{100 * p['fast_share']:.0f}%" if "fast_share" in p else "-",
             _ms(p["mean_latency_s"]),
             f"{pct_ci(p['exact_match_count'], p['samples'])} ({p['exact_match_count']})"]
            for p in {p["name"]: p for p in reversed(front)}.values()]  # a policy swept twice: once
    rows.sort(key=lambda r: [p["name"] for p in front].index(r[0]))
    out += _table(["point", "full tier", "threshold", "to fast", "mean latency ms", "exact match [95% CI]"], rows)
    out += [""]
    rec = doc.get("auto_recommended")
    if rec:
        out += [f"Recommended: **{rec['name']}** ({_f(100 * rec['fast_share'], '{:.0f}%')} to fast): "
                f"{pct_ci(rec['exact_match_count'], rec['samples'])} exact match at "
                f"{_ms(rec['mean_latency_s'])} ms, "
                f"against standard {diff_text(rec['vs_standard'])}. Rule: {rec['rule']}.", ""]
    else:
        out += ["Recommended: none (no replayed policy on the frontier is as fast as standard).", ""]
    served = doc.get("auto_served")
    if served:
        way = {"hard": "above", "easy": "at most"}[served.get("fast_when", "easy")]
        shares = ", ".join(f"{lane} {share:.0%}" for lane, share in (served.get("served_by") or {}).items())
        out += [f"The deployed router (fast lane for difficulty {way} {served['threshold']:g}"
                + (f"; served by {shares}" if shares else "") + "): "
                f"{pct_ci(served['exact_match_count'], doc['samples'])} exact match at "
                f"{_ms(served['mean_latency_s'])} ms; the offline scorer routes "
                f"{served['routing_agreement_with_offline_scorer']:.0%} of the questions as it did.", ""]
    return out


def gateway_section(doc: dict | None) -> list[str]:
    out = ["## 3. Gateway", ""]
    if doc is None:
        return out + ["Not run.", ""]
    s, eng = doc["served"], doc["in_process"]
    ref = {"fast": eng["sharded_fast"], "standard": eng["vllm_full"]}
    rows = [[lane, _f(ref[lane], "{:.0f}"), _f(s["decode_tokens_per_s"][lane], "{:.0f}"),
             _f(doc["overhead_ms_per_token"][lane], "{:+.2f}")] for lane in doc["overhead_ms_per_token"]]
    out += [f"Single stream, {doc['tokens']} tokens (over the WebSocket the median of 3 at the stage's start; in "
            "process the median of its runs, minutes later):", ""]
    out += _table(["lane", "engine in process tok/s", "over the WebSocket tok/s", "added ms per token"], rows) + [""]
    if doc.get("single_stream_alternated"):
        o = doc["single_stream_alternated"]
        out += [f"The standard lane's single stream measured again in {o['rounds']} rounds alternated with vLLM in "
                f"process (A B, B A, ...; median {statistics.median(o['websocket_tokens_per_s']):.0f} against "
                f"{statistics.median(o['in_process_tokens_per_s']):.0f} tok/s; the ratio per round: "
                + ", ".join(f"{x:.2f}x" for x in o["ratios"]) + f"): **{o['ratio']:.2f}x**"
                + (" (95% interval from the rounds: [{:.2f}, {:.2f}])".format(*o["ratio_interval"])
                   if o.get("ratio_interval") else "") + ".", ""]
    if doc.get("throughput_ceiling"):
        c = doc["throughput_ceiling"]
        rounds = (f" (medians of {c['rounds']} rounds alternating the two, A B, B A, ...; the ratio per round: "
                  + ", ".join(f"{x:.2f}x" for x in c["ratios"]) + ")") if len(c.get("ratios", [])) > 1 else ""
        out += [f"Throughput ceiling: the standard lane with {c['concurrency']} streams at once gives "
                f"{c['websocket_aggregate_tokens_per_s']:.0f} tok/s over WebSockets"
                + (f" (one each, opened before the timer starts, as a persistent WebSocket's client holds them: "
                   f"the {c['concurrency']} handshakes took {c['connect_ms']['median']:.0f} ms a round, median)"
                   if c.get("connect_ms") else "")
                + " against "
                f"{c['in_process_aggregate_tokens_per_s']:.0f} tok/s from vLLM in process"
                # a run that records connect_ms also gave the engine the served prompt's tokens
                + (" on the same prompt's tokens" if c.get("connect_ms") else "") + f"{rounds}: "
                f"**{c['ratio']:.2f}x**" + (" (the rounds' median ratio; its 95% interval from the rounds, "
                "distribution-free: [{:.2f}, {:.2f}])".format(*c["ratio_interval"]) if c.get("ratio_interval") else "")
                + ". On this "
                "machine the serving processes (HTTP proxy, router, lane replicas, the other lanes' engines) share "
                "the 2 cores with the engine, so this ratio is what the serving path costs where CPU is the "
                "bottleneck; section 5 shows the same gap against vLLM's own server.", ""]
    loop = "loopback" + (f" (measured {doc['loopback_rtt_ms']:.2f})" if doc.get("loopback_rtt_ms") else "")
    trios = [(loop, "-", s["ttft_ms"], doc["loopback_physical_limit_ms"])]
    trios += [(f"{n['rtt_ms']:g} ms round trip" + (f" (measured {n['measured_rtt_ms']:.1f})"
                                                   if n.get("measured_rtt_ms") else ""),
               n["method"], n["ttft_ms"], n["physical_limit_ms"]) for n in doc.get("emulated_network", [])]
    rows = [[net, _f(t["warm_websocket"]["p50"]), _f(t["fresh_websocket"]["p50"]), _f(t["fresh_http_sse"]["p50"]),
             _f(limit), _f(t.get("health_round_trip", {}).get("p50")), how] for net, how, t, limit in trios]
    out += [f"Time to first token on the fast lane, p50 of {doc['trials']} (ms); the physical limit is one round "
            "trip plus the engine's own time to first token in process. The round trip is measured, p50 of one "
            "byte echoed by a TCP server through the same path from a Python client (over loopback, or in the "
            "emulated network's client namespace, where the delay is the userspace relay's, its own processing "
            "is part of the network):", ""]
    out += _table(["network", "warm WebSocket", "fresh WebSocket", "fresh HTTP/SSE", "physical limit",
                   "GET /health, warm", "emulated by"],
                  rows) + [""]
    if doc.get("loopback_warm_alternated"):
        a = doc["loopback_warm_alternated"]
        out += [f"The warm WebSocket on loopback measured again in {a['rounds']} blocks alternated with the engine's "
                f"own first tokens (A B, B A, ...; {a['samples_per_side']} of each, so that the machine's drift "
                f"hits both alike): p50 {a['warm_websocket']['p50']:.2f} ms against {a['physical_limit_ms']:.2f} ms, "
                f"**{a['ratio']:.2f}x** the physical limit. The engine in process is the fast lane's ring with the "
                "lane's options (spin, prefix cache, packed weights) and its blocking client, on the same prompt"
                + ("; the served first tokens are timed by a blocking WebSocket client too (`bench/ws_blocking.py`)"
                   if a.get("client") else "") + ".", ""]
        if "door_warm_websocket" in a:
            out += [f"The fast lane's door (`GET /v1/door`: its ring's head chip serves the WebSocket in its own loop, "
                    f"`serve/lanes/door.py`), another side of the same rounds: p50 {a['door_warm_websocket']['p50']:.2f} "
                    f"ms, **{a['door_ratio']:.2f}x** the physical limit.", ""]
        if a.get("asyncio_client"):
            c = a["asyncio_client"]
            out += ["The same connections timed by `websockets`' asyncio client (standard event loop), two more sides "
                    "of the same rounds: the gateway "
                    f"{c['warm_websocket']['p50']:.2f} ms ({c['ratio']:.2f}x)"
                    + (f", the door {c['door_warm_websocket']['p50']:.2f} ms ({c['door_ratio']:.2f}x)"
                       if "door_ratio" in c else "") + ".", ""]
    for n in doc.get("emulated_network", []):
        if "physical_limit_engine_idle_ms" in n:
            w = n["ttft_ms"]["warm_websocket"]["p50"]
            out += [f"At {n['rtt_ms']:g} ms round trip a client that sends each request once it has seen the last "
                    f"one end leaves the ring idle {n['rtt_ms']:g} ms at least; the engine's first token after that "
                    f"long idle, in process: {n['engine_ttft_after_idle_ms']:.2f} ms (back to back: "
                    f"{doc['engine_ttft_ms']:.2f}). With it the physical limit is "
                    f"{n['physical_limit_engine_idle_ms']:.1f} ms and the warm WebSocket "
                    f"**{w / n['physical_limit_engine_idle_ms']:.2f}x** of it "
                    f"({w / n['physical_limit_ms']:.2f}x of the limit with the engine back to back).", ""]
    if doc.get("emulated_network_skipped"):
        out += [f"Emulated network: {doc['emulated_network_skipped']}.", ""]
    return out


def turns_section(doc: dict | None) -> list[str]:
    out = ["## 6. Multi-turn", ""]
    if doc is None:
        return out + ["Not run.", ""]
    s = doc["settings"]
    has_ci = any("last_to_first_ttft_ci95" in r["websocket"] for r in doc["loopback"].values())
    out += [f"`{doc['command']}` ({doc['date']}; a run of its own when its date is not the suite's).", ""]
    size = (f"one whole held-out source line of {s['line_tokens'][0]}-{s['line_tokens'][1]} tokens in, so turn 1 sends "
            "as much new input as the last" if s.get("line_tokens") else "one held-out source line in")
    out += [f"An agent loop: {s['turns']} turns per conversation ({size}, {s['tokens']} greedy "
            "tokens out), several conversations at once per lane (up to its batch cap), in steady state: each "
            "slot runs conversations back to back, the slots started a fraction of a conversation apart, and each "
            "slot's second conversation is measured while the others go on around it, so turn 1 meets the same load "
            "as turn 20 (`bench/turns.py` says why). "
            + (f"Before each turn the client waits a random think time (uniform, {s['think_ms']:g} ms on average: an "
               "agent's tools run between its turns), so that the conversations do not fall into step (`THINK_MS` in "
               "`bench/turns.py` says what that did). " if s.get("think_ms") else "") +
            "`websocket`: one persistent "
            "WebSocket per conversation, each turn only its new line with `previous_response_id`; `http_resend`: "
            "each turn a fresh HTTP connection to `/v1/chat/completions` re-sending the whole history. "
            + (f"The loop runs {s['repeats']} times per way, ways alternating, each time on other conversations; "
               if s.get("repeats", 1) > 1 else "") +
            "time to first token is the client's, median over the measured conversations (of every run); wall time "
            "a measured conversation's (median" + ("; without its think time" if s.get("think_ms") else "") + "); "
            + ("the interval of last / first is a 95% bootstrap one over the measured conversations (one turn's median "
               "moves a lot between runs here); " if has_ci else "") +
            "`cached` is the input tokens the lane "
            "reused from earlier turns on the last turn (of its input tokens). Goals: the last turn's time to first "
            f"token within {doc['goals']['ttft_last_over_first_at_most']}x of the first's, and the WebSocket's wall "
            f"time at most {doc['goals']['wall_ratio_at_most']}x the re-send's.", ""]
    nets = [("loopback", None, doc["loopback"])]
    nets += [(f"{n['rtt_ms']:g} ms round trip", n["method"], n["lanes"]) for n in doc.get("emulated_network", [])]
    rows = []
    for net, _, lanes in nets:
        for lane, r in lanes.items():
            for way in ("websocket", "http_resend"):
                w = r[way]
                t = w["ttft_ms_per_turn"]
                ci = w.get("last_to_first_ttft_ci95")  # (absent from older results)
                ratio = f"{w['last_to_first_ttft']:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
                rows.append([net, lane, way, _f(t[0]), _f(t[-1]), ratio,
                             f"{w['cached_tokens_per_turn'][-1]:.0f} of {w['input_tokens_last_turn']:.0f}",
                             f"{w['wall_s']:.2f}", f"{r['wall_ratio']:.2f}x" if way == "websocket" else ""])
    out += _table(["network", "lane", "way", "TTFT turn 1 (ms)", f"TTFT turn {s['turns']} (ms)",
                   "last / first" + (" [95% interval]" if has_ci else ""), "cached, last turn", "wall (s)",
                   "wall vs re-send"], rows) + [""]
    own = [(net, lane, r["websocket"]["engine_ttft_ms_per_turn"]) for net, _, lanes in nets for lane, r in lanes.items()
           if "engine_ttft_ms_per_turn" in r["websocket"]]  # (absent from older results)
    if own:
        out += ["The lane's own first token over the WebSocket (from the lane taking the request to its first token, "
                "as the lane reports it in `response.completed`; median over the same conversations):", ""]
        out += _table(["network", "lane", "turn 1 (ms)", f"turn {s['turns']} (ms)", "last / first"],
                      [[net, lane, _f(t[0]), _f(t[-1]), f"{t[-1] / t[0]:.2f}x"] for net, lane, t in own]) + [""]
    for net, how, _ in nets[1:]:
        out += [f"{net} emulated by: {how}.", ""]
    if doc.get("emulated_network_skipped"):
        out += [f"Emulated network: {doc['emulated_network_skipped']}.", ""]
    return out


def soak_section(doc: dict | None) -> list[str]:
    out = ["## 7. Soak and vanishing clients", ""]
    if doc is None:
        return out + ["Not run.", ""]
    ws, led, mem, idle = doc["ws"], doc["ledger"], doc["memory"], doc["engines_after"]
    s = doc["settings"]
    out += [f"`{doc['command']}` ({doc['date']}, {doc['machine']['cpu_count']} cores; a run of its own when its "
            f"date is not the suite's): {ws['streams']} WebSocket streams on {ws['connections']} "
            f"connections, {s['requests']} requests each, one after the other (tiers and lengths mixed, "
            f"{s['cancel_fraction']:.0%} cancelled after their first delta, {ws['slow_connections']} connection(s) "
            f"reading slowly, {ws['reset_connections']} reset mid-stream with a TCP RST); then "
            f"{doc['sse']['streams']} OpenAI SSE streams and {doc['grpc']['streams'] if doc.get('grpc') else 0} gRPC "
            "streams, the same mix. Every request asks for a fixed number of tokens (`ignore_eos`), so a completed "
            "one must carry exactly that many. Priority requests may spill to standard; exact ones may not, so "
            "`overloaded` answers (the exact lane's batch cap, with `retry_after`) are part of the load.", ""]
    rows = [[name, "ok" if ok else "**FAILED**"] for name, ok in doc["checks"].items()]
    out += _table(["check", "result"], rows) + [""]
    ends = ", ".join(f"{k} {v}" for k, v in sorted(led["ends"].items()))
    out += [f"{led['requests']} requests ({ends}); {led['deltas']} WebSocket/gRPC deltas checked in order; "
            f"{len(led['problems'])} problems; {led['without_terminal']} without an end. Engines idle "
            f"{idle['seconds']:.2f} s after the last client finished. "
            + (f"Memory of the application's processes: {mem['before_bytes'] / 2**20:,.0f} MiB after a warm-up pass, "
               f"{mem['after_bytes'] / 2**20:,.0f} MiB after the soak ({mem['ratio']:.3f}x)." if mem["ratio"]
               else "Memory: not measured (the application was not on this machine)."), ""]
    gone = doc.get("disconnects") or []
    if gone:
        out += ["A client that vanishes mid-stream (its first token received, then a TCP RST on the WebSocket and "
                "SSE, a killed client process on gRPC): time until the lane's engine no longer holds its sequence "
                "(polled on `/health` every 5 ms; goal: 100 ms).", ""]
        doors = sorted({d["door"] for d in gone})
        lanes = list(dict.fromkeys(d["lane"] for d in gone))
        cell = {(d["door"], d["lane"]): (f"{d['freed_s'] * 1e3:.0f}" if d.get("freed_s") is not None
                                         else d.get("error", "never")) for d in gone}
        out += _table(["front door", *[f"{lane} (ms)" for lane in lanes]],
                      [[door, *[cell.get((door, lane), "-") for lane in lanes]] for door in doors]) + [""]
    faults = doc.get("faults") or []
    if faults:
        out += [f"Faults (`--kill`, {s.get('kill_after_s', 5)} s apart into the WebSocket soak, SIGKILL): the requests "
                "the lane had in flight, how they ended, and when a new request to the lane completed (goals: a "
                "retryable error within 5 s, served again within 30 s).", ""]
        out += _table(["killed", "lane", "in flight", "their ends", "last error after (s)", "served again after (s)"],
                      [[f["kill"], f["lane"], f.get("in_flight_at_kill", "-"),
                        f.get("error") or ", ".join(f"{k} {v}" for k, v in sorted(f["their_ends"].items())),
                        f.get("latest_error_s", "-"),
                        f"{f['served_again_s']:.1f}" if f.get("served_again_s") is not None else "never"]
                       for f in faults]) + [""]
    return out


def fuzz_section(doc: dict | None) -> list[str]:
    out = ["## 8. Hostile input at every front door", ""]
    if doc is None:
        return out + ["Not run.", ""]
    out += [f"`{doc['command']}` ({doc['date']}, {doc['machine']['cpu_count']} cores, {doc['seconds'] / 60:.1f} min "
            "with the application's start): `tests/serve/test_fuzz.py` with "
            f"{doc['examples_per_front_door']} Hypothesis examples per front door (40 in `make test`), against its "
            "own `fastmode up`. Every input must get a typed error, a documented close code or a valid response "
            "(never a 5xx, a crash or a hang); afterwards every lane is idle (no engine slot leaked) and a normal "
            "request is served. An input is one WebSocket connection's frames (up to six, each answer counted once "
            "per connection), one HTTP body or one gRPC message; Hypothesis may send more inputs than its example "
            "count (shrinking a failure, retrying a near-duplicate).", ""]
    rows = []
    for door, row in doc["front_doors"].items():
        answers = ", ".join(f"{k} {v}" for k, v in row.get("answers", {}).items())
        rows.append([door, "ok" if row["result"] == "passed" else f"**{row['result'].upper()}**",
                     str(row.get("inputs", "-")), _f(row.get("seconds"), "{:.0f}"), answers or "-"])
    out += _table(["front door", "result", "inputs", "seconds", "answers (WebSocket: per connection)"], rows) + [""]
    failed = [(d, r["failure"]) for d, r in doc["front_doors"].items() if r.get("failure")]
    out += [f"{door} failed: `{msg.splitlines()[0][:300]}`" for door, msg in failed]
    return out + ([""] if failed else [])


def sharding_section(doc: dict | None) -> list[str]:
    out = ["## 4. Sharding", ""]
    if doc is None:
        return out + ["Not run.", ""]
    trials = len(doc["layouts"][0].get("trials_tokens_per_s", [0])) if doc["layouts"] else 1
    median = f" (the median of {trials} such sequences per layout)" if trials > 1 else ""
    out += ["The fast model on our executor, one sequence, "
            f"{doc['steps']} decode steps{median}, Ray with one `chip` per shard on {doc['cores']} cores (layouts of more "
            "chips than cores share them):", ""]
    rows = []
    for r in doc["layouts"]:
        hops = "; ".join(f"{k}: {v['median_ms']:.2f} ms, {v['bytes']} B" for k, v in r["hops"].items()) or "-"
        rows.append([f"{r['tp']}x{r['pp']}", r["transport"], _f(r["tokens_per_s"], "{:.0f}"), _f(r["step_ms"], "{:.2f}"),
                     _f(r["compute_ms"], "{:.2f}"), hops, _f(r["predicted_tokens_per_s"], "{:.0f}"),
                     _f(r["measured_over_predicted"], "{:.2f}")])
    out += _table(["tp x pp", "transport", "tok/s", "step ms", "compute ms", "hops (median, payload)", "planner tok/s",
                   "measured / planner"], rows) + [""]
    for layout, why in (doc.get("skipped_layouts") or {}).items():
        out += [f"Not run: {layout} ({why}).", ""]
    if doc.get("bare_round_trip_ms"):
        out += ["Bare transports, the candidates for a per-token hop (driver -> a -> b -> driver, 1 KiB; "
                "idle: the CPU an idle actor of the pair used over 2 s): " + ", ".join(
            f"{k} {v['round_trip_ms']:.3f} ms" + (f" (idle {100 * v['idle_cpu']:.0f}% of a core)" if "idle_cpu" in v else "")
            if isinstance(v, dict) else f"{k} {v:.2f} ms" for k, v in doc["bare_round_trip_ms"].items()) + ".", ""]
    if doc.get("planner_choice"):
        p = doc["planner_choice"]
        out += [f"The planner's pick for {p['chips']} `cpu-core` chips: {p['tp']}x{p['pp']}; the fastest measured: "
                f"{p['fastest_measured']['tp']}x{p['fastest_measured']['pp']} "
                f"({p['fastest_measured']['transport']}).", ""]
    return out


def decode_section(doc: dict | None, suite: dict | None = None) -> list[str]:
    """Batch-1 decode in process on the full model (``bench.decode``): fastmode's executor, llama.cpp's
    ``llama-bench`` and vLLM's engine, same weights and threads, and where a token's time goes."""
    out = ["### Batch-1 decode in process: the executor against llama-bench and vLLM", ""]
    if doc is None:
        if suite is not None and "decode" not in suite.get("stages", {}):
            return out + ["Not in this run: its stages (above) did not include `decode` (`fastmode bench decode`).", ""]
        return out + ["Not run (`fastmode bench decode`).", ""]
    s = doc["settings"]
    types = ", ".join(f"{n} {t}" for t, n in sorted((doc.get("gguf") or {}).get("tensor_types", {}).items()))
    out += [f"`{doc['command']}` ({doc['date']}): the full model `{doc['model']}`, one greedy sequence of "
            f"{s['tokens']} tokens, {s['threads']} threads each, {s['rounds']} alternating rounds. fastmode: "
            "`sharding.Engine` compiled with packed bfloat16 weights (float32 arithmetic), start-up (load, compile, "
            f"warm-up) {doc['fastmode_start_s']:.0f} s. llama.cpp: `llama-bench -p 0 -n {s['tokens']}` on the same "
            f"weights as GGUF ({types or 'not converted'}).", ""]
    for name, why in (doc.get("skipped") or {}).items():
        out += [f"Skipped: {name} ({why}).", ""]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    v = doc.get("vllm") or {}
    rows = [["fastmode executor", _f(med(doc["fastmode_tokens_per_s"])),
             ", ".join(f"{x:.1f}" for x in doc["fastmode_tokens_per_s"])]]
    if doc.get("llama_bench_tokens_per_s"):
        rows.append(["llama-bench", _f(med(doc["llama_bench_tokens_per_s"])),
                     ", ".join(f"{x:.1f}" for x in doc["llama_bench_tokens_per_s"])])
    if v.get("per_user_tokens_per_s_p50"):
        rows.append(["vLLM engine (the priority lane's, in process)", _f(v["per_user_tokens_per_s_p50"]), "-"])
    elif v.get("error"):
        out += [f"vLLM did not run: {v['error'][0]}", ""]
    out += _table(["engine", "tok/s (median)", "rounds"], rows) + [""]
    if doc.get("ratio_median") is not None:
        met = "yes" if doc["ratio_median"] >= 1.0 else "**no**"
        out += [f"fastmode / llama-bench: **{doc['ratio_median']:.2f}x** (target >= 1.0x: {met}).", ""]
    p = doc.get("profile")
    if p:
        out += [f"Where a token's time goes (one more fastmode round under `torch.profiler`, {p['step_ms']:.2f} ms "
                f"per token; each token streams {p['weight_bytes_per_token'] / 2**20:.0f} MiB of bfloat16 weights, "
                f"the linears at {_f(p['linears_gb_per_s'])} GB/s; the head alone is "
                f"{p['head_macs_per_token'] / 1e6:.1f}M multiply-adds):", ""]
        out += _table(["part", "ms per token", "share"], [[k, f"{ms:.2f}", f"{ms / p['step_ms']:.0%}"]
                                                         for k, ms in p["per_token_ms"].items()]) + [""]
    return out


def baseline_section(vllm: dict | None, ours: dict | None) -> list[str]:
    out = ["## 5. What users would pick instead: vLLM's own OpenAI server, Ray Serve LLM, llama.cpp", ""]
    if vllm is None or ours is None:
        return out + ["Not run (needs both `fastmode bench vllm` and `fastmode bench lanes --api openai`).", ""]
    out += ["The same load generator through the same OpenAI API (`/v1/completions` over SSE, one pooled "
            "keep-alive HTTP client), same requests: vLLM's server alone on the machine, then fastmode's lanes. "
            "vLLM runs with its default batch cap and the same KV-cache size as fastmode's lanes; Ray Serve's own "
            "LLM stack (`ray.serve.llm.build_openai_app`: an OpenAI ingress deployment in front of an `LLMServer` "
            "deployment running vLLM) gets the standard lane's engine settings, batch cap included:", ""]
    for name, cmd in vllm["settings"]["server_commands"].items():
        out += [f"- `python {cmd.split('python', 1)[-1].strip()}`"]
    out += [""]
    pairs = [("vllm-full", "standard"), ("ray-serve-llm-full", "standard"), ("vllm-full", "priority"),
             ("vllm-full-spec", "exact"), ("vllm-fast", "fast")]
    rows = []
    for theirs, mine in pairs:
        a, b = vllm["lanes"].get(theirs), ours["lanes"].get(mine)
        if not a or not b:
            continue
        for ra in a:
            rb = next((r for r in b if r["concurrency"] == ra["concurrency"]), None)
            if rb is None:
                continue
            ua, ub = ra["per_user_e2e_tokens_per_s"]["p50"], rb["per_user_e2e_tokens_per_s"]["p50"]
            aa, ab = ra["aggregate_tokens_per_s"], rb["aggregate_tokens_per_s"]
            rows.append([f"{mine} vs {theirs}", str(ra["concurrency"]), _f(ub), _f(ua),
                         _f(ub / ua if ua and ub else None, "{:.2f}x"), _f(ab, "{:.0f}"), _f(aa, "{:.0f}"),
                         _f(ab / aa if aa and ab else None, "{:.2f}x"), _ms(rb["ttft_s"]["p50"]),
                         _ms(ra["ttft_s"]["p50"]), _f(rb["rejection_rate"] and 100 * rb["rejection_rate"], "{:.0f}%")])
    out += ["Per-user speed here is end to end (output tokens / (last token - request sent)): the two servers "
            "chunk their streams differently, and per-chunk decode timing would favour the one that sends "
            "tokens in bursts.", ""]
    out += _table(["fastmode lane vs other server", "streams", "fastmode per-user tok/s", "other per-user tok/s",
                   "ratio", "fastmode aggregate tok/s", "other aggregate tok/s", "ratio", "fastmode TTFT p50 ms",
                   "other TTFT p50 ms", "fastmode rejected"], rows) + [""]
    failed = [f"{name} at {r['concurrency']} streams: {r['errors']}" for doc in (vllm, ours)
              for name, rows in doc["lanes"].items() for r in rows if r["errors"]]
    if failed:
        out += ["Failed attempts, sent again (counted, not in the figures): " + "; ".join(failed) + ".", ""]
    out += ["vLLM's server and Ray Serve LLM each run one engine with nothing beside it; fastmode serves three lanes (two vLLM engines and "
            "the fast pipeline) on the same cores, with its router and gateway in front. The priority lane caps "
            "its batch on purpose and rejects the rest (the last column); so does the exact lane, whose baseline "
            "is vLLM's server with the same speculative decoding (`--speculative-config`, the fast model "
            "drafting) at vLLM's default batch cap.", ""]
    return out


def paired_section(paired: dict | None) -> list[str]:
    """Section 5's standard-against-vLLM comparison again, the two servers measured in alternation."""
    out = ["### The standard lane and vLLM's server, measured in alternation", ""]
    if paired is None:
        return out + ["Not run (`fastmode bench paired`).", ""]
    st = paired["settings"]
    out += [f"`{paired['command']}` ({paired['date']}; a run of its own when its date is not the suite's). "
            "The table above takes vLLM's figures minutes before fastmode's, and this machine's speed drifts over "
            "minutes. Here vLLM's server runs beside the (idle) application, each server idle while the other "
            f"is measured, and each level is measured on both, in {st['rounds']} rounds whose order flips "
            f"(A B, B A, ...); {st['tokens']} tokens per request, the same load generator and OpenAI API. "
            "Each side pays for the other's idle processes. Ratios are fastmode's standard lane over vLLM's "
            "server, per round and their median:", ""]
    from bench.paired import OURS, THEIRS

    def median(name: str, level: int, figure: Callable[[dict], float]) -> float:
        return statistics.median(figure(next(x for x in rnd["results"][name] if x["concurrency"] == level))
                                 for rnd in paired["rounds"])

    per_user, aggregate = (lambda x: x["per_user_e2e_tokens_per_s"]["p50"]), (lambda x: x["aggregate_tokens_per_s"])
    rows = []
    for level, r in sorted(paired["ratios"].items(), key=lambda kv: int(kv[0])):
        n = int(level)
        rows.append([str(level), _f(median(OURS, n, per_user)), _f(median(THEIRS, n, per_user)),
                     f"**{r['per_user_median']:.2f}x** ({', '.join(f'{x:.2f}' for x in r['per_user'])})",
                     _f(median(OURS, n, aggregate), "{:.0f}"), _f(median(THEIRS, n, aggregate), "{:.0f}"),
                     f"**{r['aggregate_median']:.2f}x** ({', '.join(f'{x:.2f}' for x in r['aggregate'])})"])
    out += _table(["streams", "standard per-user tok/s (median)", "vLLM per-user tok/s (median)",
                   "per-user ratio (rounds)", "standard aggregate tok/s", "vLLM aggregate tok/s",
                   "aggregate ratio (rounds)"], rows) + [""]
    return out


def llama_cpp_section(doc: dict | None, suite: dict | None, ws: dict | None, openai: dict | None) -> list[str]:
    """llama.cpp's ``llama-server`` on the same checkpoints (``bench.llama_cpp_serve``), and fastmode's
    lanes against it (``bench.targets.LLAMA_CPP_GOALS``)."""
    out = ["### llama.cpp's server on the same models", ""]
    if doc is None:
        if suite is not None and "llama-cpp" not in suite.get("stages", {}):
            return out + ["Not in this run: its stages (above) did not include `llama-cpp` "
                          "(`fastmode bench llama-cpp`).", ""]
        return out + ["Not run (`fastmode bench llama-cpp`).", ""]
    if doc.get("unavailable"):
        u = doc["unavailable"]
        return out + [f"Skipped: llama.cpp is unavailable here ({u['error']}, `{u['code']}`): "
                      f"{u['message'].strip().splitlines()[0]}", ""]
    s = doc["settings"]
    models = doc.get("models") or {}
    precision = "; ".join(f"{m}: " + ", ".join(f"{n} {t}" for t, n in sorted(r["tensor_types"].items()))
                          + " tensors" for m, r in sorted(models.items()))
    version = (doc.get("llama_cpp") or {}).get("version")
    out += [f"`{doc['command']}` ({doc['date']}): {doc['source']}"
            + (f" (llama-server {version})" if version else "") + ". The full and fast checkpoints fastmode "
            f"serves, converted with their precision ({precision}); each server alone on the machine, a fresh one "
            "per level with as many `--parallel` slots as streams; "
            f"{s['placement']}. The same load generator and OpenAI API as above ({s['max_output_tokens']}-token "
            f"greedy requests, `ignore_eos`{workload(s)}). The speculative server drafts with the fast model, "
            f"{s['draft_tokens']} tokens per step ({s['draft_tokens_rule']}):", ""]
    out += [f"- `{cmd}`" for cmd in (s.get("server_commands") or {}).values()] + [""]
    for name, why in (doc.get("skipped") or {}).items():
        out += [f"Skipped: {name} ({why.strip().splitlines()[0]}).", ""]
    rows = []
    for name, levels in doc["lanes"].items():
        for r in levels:
            d = r.get("draft") or {}
            rows.append([name, str(r["concurrency"]), str(r["completed"]), _f(r["per_user_e2e_tokens_per_s"]["p50"]),
                         _f(r["aggregate_tokens_per_s"], "{:.0f}"), _ms(r["ttft_s"]["p50"]),
                         _f(r.get("server_decode_tokens_per_s_p50")), _f(d.get("acceptance_rate"), "{:.0%}")])
    if rows:
        out += _table(["server", "streams", "done", "per-user tok/s p50 (end to end)", "aggregate tok/s",
                       "TTFT p50 ms", "its own decode tok/s p50", "drafts accepted"], rows) + [""]
    failed = [f"{name} at {r['concurrency']} streams: {r['errors']}" for name, levels in doc["lanes"].items()
              for r in levels if r["errors"]]
    if failed:
        out += ["Failed attempts, sent again (not in the figures): " + "; ".join(failed) + ".", ""]
    front = {"websocket": "WebSocket", "openai": "OpenAI API"}
    goal_rows = [[g.name, f"{g.lane} over the {front[g.api]}", g.theirs, _f(a), _f(b), _f(ratio, "{:.2f}x"),
                  f">= {g.at_least:g}x", "-" if ratio is None else ("yes" if ratio >= g.at_least else "**no**")]
                 for g, a, b, ratio in llama_cpp_ratios(doc, ws, openai)]
    out += ["fastmode against llama-server on the same model (per-user: end to end, p50; aggregate: the level's "
            "output tokens over its wall time), fastmode's figures from this run's lanes stages:", ""]
    out += _table(["ratio", "fastmode", "llama.cpp", "fastmode tok/s", "llama-server tok/s", "ratio", "target",
                   "met"], goal_rows) + [""]
    return out


def headline_section(results: Path) -> list[str]:
    """The run's headline ratios against their targets (``bench.headline``; the README shows the same table)."""
    rows = headline.rows(results)
    return ["## Headline", "", *headline.table(rows), ""] if rows else []


def write_report(results: Path, docs: Path) -> str:
    results, docs = Path(results), Path(docs)
    suite = _load(results, "suite.json")
    lines = ["# Benchmarks", "", "<!-- generated by bench/report.py from the JSON in "
             f"{shown(results)}/; do not edit by hand: run `make bench` -->", ""]
    lines += header(suite)
    lines += ["Figures are ratios within this one run: this machine's absolute speed drifts by up to 2x over a "
              "day. Each JSON file in the results directory has every raw figure and its settings.", ""]
    lines += headline_section(results)
    lines += lanes_section(_load(results, "lanes_load.json"), results, docs)
    lines += quality_section(_load(results, "quality.json"), results, docs)
    lines += gateway_section(_load(results, "gateway.json"))
    lines += sharding_section(_load(results, "sharding.json"))
    lines += decode_section(_load(results, "decode.json"), suite)
    lines += baseline_section(_load(results, "vllm_serve.json"), _load(results, "lanes_load_openai.json"))
    lines += paired_section(_load(results, "paired.json"))
    lines += llama_cpp_section(_load(results, "llama_cpp.json"), suite, _load(results, "lanes_load.json"),
                               _load(results, "lanes_load_openai.json"))
    lines += turns_section(_load(results, "turns.json"))
    lines += soak_section(_load(results, "soak.json"))
    lines += fuzz_section(_load(results, "fuzz.json"))
    text = "\n".join(lines).rstrip() + "\n"
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=REPO / "bench/results")
    ap.add_argument("--out", type=Path, default=REPO / "docs/benchmarks.md")
    ap.add_argument("--readme", type=Path, help="also rewrite this README's headline table (between its "
                    "bench.headline markers) from the same results: how a published run reaches the README")
    args = ap.parse_args(argv)
    write_report(args.results, args.out)
    print(f"wrote {args.out}")
    if args.readme:
        try:
            headline.update_readme(args.readme, headline.table(headline.rows(args.results)))
        except headline.MarkersMissing as e:
            print(f"bench.report: {e}", file=sys.stderr)
            return 2
        print(f"wrote the headline table of {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
