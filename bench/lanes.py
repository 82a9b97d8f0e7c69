"""Lanes under load: a closed-loop concurrency sweep over the real gateway (``fastmode bench lanes``).

For each concurrency level N (default 1, 4, 16, 32) and each lane (standard, priority, fast, exact), N
workers share one persistent WebSocket (``clients.sdk.AsyncClient``, as users connect) and each
runs ``--requests-per-stream`` requests back to back: a fixed prompt, greedy, ``ignore_eos`` and a
fixed ``max_output_tokens``, so every request does the same work. ``--workload`` (``bench.targets``):
``chat``, one user message through the model's chat template (the default for a full model with a
chat template: how an instruct pair is called, and what its distilled draft learned), or
``completion``, raw text to continue. Levels run one lane at a time,
the lanes interleaved within each level, so slow drift of this shared machine hits every lane alike.

Per request: the client's time to first token (send -> first text delta), its per-user decode
speed (``(output_tokens - 1) / (end - first delta)``), its end-to-end speed (``output_tokens /
(end - send)``: the one to compare across servers that chunk their streams differently, since the
decode speed assumes the first delta holds one token) and the server's ``timing`` and
``cost_units``. Per level and lane: per-user decode tokens/s (p50, p10), time to first token
(p50, p99), aggregate tokens/s (output tokens of the level / its wall time), and the cost,
**chip-seconds per 1k output tokens** = chips the lane occupies x wall seconds / (output tokens / 1000).

Chips per lane (the assumption, also written into the JSON): the fast lane occupies ``tp x pp``
chips per replica (its executor's chip actors; default 1 x 2), the priority and standard lanes one
chip per replica (one vLLM engine each: on a CPU machine "one chip" is one engine replica, on a
GPU machine one GPU). Read from the app config (``--config``, default the embedded default, which
is what ``fastmode up`` serves without ``--config``): the gateway does not report it.

The priority lane admits ``max_num_seqs`` (2) streams and rejects the rest with ``overloaded``;
the benchmark never spills (``allow_spill`` stays off). A rejected worker waits the server's
``retry_after`` and tries again, so every worker still completes its requests; the level records
its rejections, and the rejection rate is rejections / attempts. Per-user numbers are over the
admitted (completed) requests.

Headline ratios, within this one run, against standard at its **saturating load** (the level
with standard's highest aggregate tokens/s): priority's per-user decode speed at the lowest level
(Anthropic's fast mode: 2.5x), priority's cost at its own saturating level (Anthropic's fast mode:
6x the price), fast's per-user speed at the lowest level (OpenAI's Codex-Spark: 15x), and exact's
per-user speed at the lowest level against standard's and priority's, with its drafts' acceptance
and tokens per verify step.

Needs a running application (``fastmode up``); it does not start one.

``--api openai`` drives the same sweep through the OpenAI-compatible HTTP API instead
(``/v1/completions`` over SSE, ``bench.targets.openai_request``), the path on which vLLM's own
server is measured (``bench.vllm_serve``), so the two compare like for like.

Usage: fastmode bench lanes [--api websocket|openai] [--url ws://127.0.0.1:8000] [--api-key K] [--workload W]
                            [--levels 1,4,8,16,32] [--tokens 128] [--requests-per-stream 3]
                            [--lanes standard,priority,fast,exact] [--quick] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shlex
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np

from bench.targets import WORKLOADS, openai_request, prompt_of, websocket_request, workload_for

LANES: dict[str, tuple[str, str | None]] = {"standard": ("fastmode-full", "default"),
                                            "priority": ("fastmode-full", "priority"),
                                            "fast": ("fastmode-fast", None),
                                            "exact": ("fastmode-full", "exact")}
PUBLISHED = {"priority_per_user_speed": 2.5, "priority_cost": 6.0, "fast_per_user_speed": 15.0}
"""The published figures the headline ratios are read against: Anthropic's fast mode, 2.5x the
per-user speed at 6x the price (the priority lane's counterpart); OpenAI's Codex-Spark (on
Cerebras), 15x the per-user speed (the fast lane's)."""
PUBLISHED_BY = {"priority_per_user_speed": "Anthropic's fast mode", "priority_cost": "Anthropic's fast mode",
                "fast_per_user_speed": "OpenAI's Codex-Spark"}
"""Who published each of ``PUBLISHED``."""
CONNECTION = {"websocket": "one persistent WebSocket (clients.sdk.AsyncClient) for every stream",
              "openai": "OpenAI-compatible /v1/completions streamed over SSE, one pooled httpx.AsyncClient "
                        "(keep-alive connections)"}
QUICK = {"levels": [1, 2], "tokens": 16, "requests_per_stream": 1}
MIN_REQUESTS_PER_LEVEL = 12
"""A full run's level completes at least this many requests (streams x per-stream requests, the
per-stream count raised at low concurrency): three 128-token requests of the fast lane last a
third of a second, and their median swung by 30% between runs on this shared machine."""
LEVELS = [1, 4, 8, 16, 32]
"""Concurrency levels of the full run (vLLM's server is measured at the same ones)."""


def pct(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (linear interpolation), ``None`` for no values."""
    return float(np.percentile(values, q)) if values else None


def lane_chips(config: Any, layout: dict[str, int] | None = None) -> dict[str, int]:
    """Chips each lane occupies: fast tp x pp per replica (``layout``: what the server reports it
    deployed, else the config's), priority and standard one per replica."""
    lanes = config.lanes
    tp, pp = (layout["tp"], layout["pp"]) if layout else (lanes.fast.tp, lanes.fast.pp)
    if not (isinstance(tp, int) and isinstance(pp, int)):
        raise ValueError(f"the fast lane's layout is tp={tp} x pp={pp}: read it from the server (/health)")
    return {"fast": tp * pp * lanes.fast.replicas,
            "priority": lanes.priority.replicas, "standard": lanes.standard.replicas, "exact": lanes.exact.replicas}


def served_layout(url: str) -> dict[str, int] | None:
    """The fast lane's tp and pp as the server at ``url`` (ws:// or http://) deployed them (``/health``)."""
    import httpx

    base = "http" + url[2:] if url.startswith("ws") else url
    try:
        layout = httpx.get(base.rstrip("/") + "/health", timeout=30).json()["lanes"]["fast"].get("layout")
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    return {"tp": layout["tp"], "pp": layout["pp"]} if layout else None


async def run_level(send: Callable[[int], Awaitable[dict]], lane: str, concurrency: int, tokens: int,
                    per_stream: int, chips: int, bar=None, max_retry_wait_s: float = 5.0) -> dict[str, Any]:
    """``concurrency`` closed-loop workers, ``per_stream`` completed requests each; ``send(tokens)``
    runs one request (``bench.targets``) and raises the SDK's ``Overloaded`` on a rejection."""
    from clients.sdk import FastmodeError, Overloaded

    done: list[dict[str, Any]] = []
    rejected, errors = 0, Counter()

    async def worker() -> None:
        nonlocal rejected
        completed = 0
        failures = 0
        while completed < per_stream:
            try:
                done.append(await send(tokens))
                completed += 1
                if bar is not None:
                    bar.update(1)
            except Overloaded as e:
                rejected += 1
                await asyncio.sleep(min(max_retry_wait_s, e.retry_after if e.retry_after else 0.5))
            except FastmodeError as e:
                errors[e.code] += 1
                failures += 1
                if failures >= 3:  # a lane that keeps failing: give up on this worker, keep the record
                    return
                await asyncio.sleep(0 if e.code == "transport_error" else 0.5)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    out_tokens = sum(r["output_tokens"] for r in done)
    per_user = [r["decode_tokens_per_s"] for r in done if r["decode_tokens_per_s"] is not None]
    ttft = [r["ttft_s"] for r in done]
    e2e = [r["e2e_tokens_per_s"] for r in done if r["e2e_tokens_per_s"] is not None]
    cost_units = [r["cost_units"] for r in done if r["cost_units"] is not None]
    attempts = len(done) + rejected + sum(errors.values())
    return {
        "lane": lane, "concurrency": concurrency, "attempts": attempts, "completed": len(done),
        "rejected": rejected, "rejection_rate": rejected / attempts if attempts else None,
        "errors": dict(errors), "output_tokens": out_tokens, "wall_s": wall,
        "aggregate_tokens_per_s": out_tokens / wall if wall > 0 else None,
        "per_user_decode_tokens_per_s": {"p50": pct(per_user, 50), "p10": pct(per_user, 10),
                                         "mean": float(np.mean(per_user)) if per_user else None},
        "per_user_e2e_tokens_per_s": {"p50": pct(e2e, 50), "p10": pct(e2e, 10)},
        "text_chunks_per_request_p50": pct([r["chunks"] for r in done], 50),
        "ttft_s": {"p50": pct(ttft, 50), "p99": pct(ttft, 99), "max": max(ttft) if ttft else None},
        "server_ttft_s_p50": pct([r["server_ttft_s"] for r in done if r["server_ttft_s"] is not None], 50),
        "server_decode_tokens_per_s_p50": pct([r["server_decode_tokens_per_s"] for r in done
                                               if r["server_decode_tokens_per_s"] is not None], 50),
        "chips": chips,
        "chip_seconds_per_1k_output_tokens": chips * wall / (out_tokens / 1000) if out_tokens else None,
        "cost_units_per_1k_output_tokens": 1000 * sum(cost_units) / out_tokens if out_tokens and cost_units else None,
        "lanes_served": sorted({str(r["lane"]) for r in done}),
        "speculative": speculative_totals([r["speculative"] for r in done if r.get("speculative")]),
    }


def speculative_totals(specs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The exact lane's drafts over a level's requests: acceptance (accepted / drafted) and tokens per
    verify step, pooled over every verify step."""
    steps = sum(s["verify_steps"] for s in specs)
    if not steps:
        return None
    accepted, drafted = sum(s["accepted"] for s in specs), sum(s["drafted"] for s in specs)
    return {"requests": len(specs), "draft_tokens": specs[0]["draft_tokens"], "verify_steps": steps,
            "acceptance_rate": accepted / drafted if drafted else None, "tokens_per_step": 1 + accepted / steps}


def _get(results: dict, lane: str, level: int) -> dict | None:
    return next((r for r in results[lane] if r["concurrency"] == level), None)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def headline(results: dict[str, list[dict]]) -> dict[str, Any]:
    """The headline ratios against standard at its saturating load (see the module docstring)."""
    def best(lane: str) -> dict | None:
        rows = [r for r in results.get(lane, []) if r["aggregate_tokens_per_s"]]
        return max(rows, key=lambda r: r["aggregate_tokens_per_s"]) if rows else None

    std = best("standard")
    out: dict[str, Any] = {"published": PUBLISHED}
    if std is None:
        return out
    std_user = std["per_user_decode_tokens_per_s"]["p50"]
    std_cost = std["chip_seconds_per_1k_output_tokens"]
    std_units = std["cost_units_per_1k_output_tokens"]
    out["standard_saturating_concurrency"] = std["concurrency"]
    out["standard_at_saturation"] = {"per_user_decode_tokens_per_s_p50": std_user,
                                     "aggregate_tokens_per_s": std["aggregate_tokens_per_s"],
                                     "chip_seconds_per_1k_output_tokens": std_cost}
    levels = sorted({r["concurrency"] for rows in results.values() for r in rows})
    low = levels[0]
    if results.get("priority"):
        p_low, p_best = _get(results, "priority", low), best("priority")
        out["priority_concurrency_for_speed"] = low
        out["priority_per_user_speed_ratio"] = _ratio(p_low and p_low["per_user_decode_tokens_per_s"]["p50"],
                                                      std_user)
        if p_best is not None:
            out["priority_saturating_concurrency"] = p_best["concurrency"]
            out["priority_cost_ratio"] = _ratio(p_best["chip_seconds_per_1k_output_tokens"], std_cost)
            out["priority_price_ratio"] = _ratio(p_best["cost_units_per_1k_output_tokens"], std_units)
        out["priority_cost_ratio_at_lowest_level"] = _ratio(p_low and p_low["chip_seconds_per_1k_output_tokens"],
                                                            std_cost)
    if results.get("fast"):
        f_low, f_same = _get(results, "fast", low), _get(results, "fast", std["concurrency"])
        out["fast_concurrency_for_speed"] = low
        out["fast_per_user_speed_ratio"] = _ratio(f_low and f_low["per_user_decode_tokens_per_s"]["p50"], std_user)
        out["fast_per_user_speed_ratio_at_equal_load"] = _ratio(
            f_same and f_same["per_user_decode_tokens_per_s"]["p50"], std_user)
        f_best = best("fast")
        if f_best is not None:
            out["fast_cost_ratio"] = _ratio(f_best["chip_seconds_per_1k_output_tokens"], std_cost)
    if results.get("exact"):
        e_low, e_best = _get(results, "exact", low), best("exact")
        e_user = e_low and e_low["per_user_decode_tokens_per_s"]["p50"]
        out["exact_concurrency_for_speed"] = low
        out["exact_per_user_speed_ratio"] = _ratio(e_user, std_user)
        p_low = _get(results, "priority", low) if results.get("priority") else None
        out["exact_per_user_speed_vs_priority"] = _ratio(e_user, p_low and p_low["per_user_decode_tokens_per_s"]["p50"])
        out["exact_speculative_at_lowest_level"] = e_low and e_low.get("speculative")
        if e_best is not None:
            out["exact_cost_ratio"] = _ratio(e_best["chip_seconds_per_1k_output_tokens"], std_cost)
            out["exact_price_ratio"] = _ratio(e_best["cost_units_per_1k_output_tokens"], std_units)
    return out


def plot(results: dict[str, list[dict]], path: Path, title: str) -> None:
    """Two panels: per-user decode tokens/s (p50) and aggregate tokens/s against concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"standard": "tab:blue", "priority": "tab:orange", "fast": "tab:green", "exact": "tab:purple"}
    for lane, rows in results.items():
        xs = [r["concurrency"] for r in rows]
        user = [r["per_user_decode_tokens_per_s"]["p50"] or float("nan") for r in rows]
        p10 = [r["per_user_decode_tokens_per_s"]["p10"] or float("nan") for r in rows]
        agg = [r["aggregate_tokens_per_s"] or float("nan") for r in rows]
        axes[0].plot(xs, user, "o-", color=colors.get(lane), label=f"{lane} p50")
        axes[0].plot(xs, p10, ":", color=colors.get(lane), alpha=0.6, label=f"{lane} p10")
        axes[1].plot(xs, agg, "o-", color=colors.get(lane), label=lane)
    for ax, ylabel in zip(axes, ("per-user decode tokens/s", "aggregate output tokens/s"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        levels = sorted({r["concurrency"] for rows in results.values() for r in rows})
        ax.set_xticks(levels, [str(x) for x in levels])
    axes[0].set_title("per-user speed (priority: admitted requests)")
    axes[1].set_title("aggregate throughput")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def summary(results: dict[str, list[dict]], head: dict[str, Any]) -> str:
    lines = [f"{'lane':<9} {'conc':>4} {'done':>4} {'rej%':>5} {'user p50':>8} {'user p10':>8} "
             f"{'ttft p50':>8} {'ttft p99':>8} {'agg tok/s':>9} {'chip-s/1k':>9} {'units/1k':>8}"]
    for lane, rows in results.items():
        for r in rows:
            u, t = r["per_user_decode_tokens_per_s"], r["ttft_s"]
            lines.append(f"{lane:<9} {r['concurrency']:>4} {r['completed']:>4} "
                         f"{_f(100 * r['rejection_rate'] if r['rejection_rate'] is not None else None, '{:.0f}'):>5} "
                         f"{_f(u['p50']):>8} {_f(u['p10']):>8} {_f(t['p50'] and 1e3 * t['p50'], '{:.0f}ms'):>8} "
                         f"{_f(t['p99'] and 1e3 * t['p99'], '{:.0f}ms'):>8} {_f(r['aggregate_tokens_per_s']):>9} "
                         f"{_f(r['chip_seconds_per_1k_output_tokens'], '{:.2f}'):>9} "
                         f"{_f(r['cost_units_per_1k_output_tokens'], '{:.2f}'):>8}")
    if "standard_saturating_concurrency" in head:
        lines.append("")
        lines.append(f"headline, against standard at its saturating load ({head['standard_saturating_concurrency']} "
                     "streams):")
        rows = [("priority per-user speed", "priority_per_user_speed_ratio", "priority_per_user_speed"),
                ("priority cost (chip-s per 1k)", "priority_cost_ratio", "priority_cost"),
                ("fast per-user speed", "fast_per_user_speed_ratio", "fast_per_user_speed")]
        for name, key, figure in rows:
            lines.append(f"  {name:<30} {_f(head.get(key), '{:.2f}x'):>8}   "
                         f"({PUBLISHED_BY[figure]}: {PUBLISHED[figure]:g}x)")
        if "exact_per_user_speed_ratio" in head:
            spec = head.get("exact_speculative_at_lowest_level") or {}
            lines.append(f"  {'exact per-user speed':<30} {_f(head.get('exact_per_user_speed_ratio'), '{:.2f}x'):>8}   "
                         f"({_f(head.get('exact_per_user_speed_vs_priority'), '{:.2f}x')} priority's; drafts accepted "
                         f"{_f(spec.get('acceptance_rate'), '{:.2f}')}, {_f(spec.get('tokens_per_step'), '{:.2f}')} "
                         "tokens per verify step)")
    return "\n".join(lines)


def per_stream_at(level: int, per_stream: int, min_per_level: int) -> int:
    """Requests per stream at ``level`` streams: ``per_stream``, or more so that the level completes
    at least ``min_per_level`` requests."""
    return max(per_stream, -(-min_per_level // level))


async def sweep_targets(targets: dict[str, tuple[Callable[[int], Awaitable[dict]], int]], levels: list[int],
                        tokens: int, per_stream: int, desc: str = "lanes",
                        min_per_level: int = 0) -> dict[str, list[dict]]:
    """The closed-loop sweep over ``targets`` (name -> (send, chips)): a short warm-up request per
    target, then each level with the targets interleaved (slow drift hits every target alike);
    each level completes at least ``min_per_level`` requests per target (``per_stream_at``)."""
    from tqdm import tqdm

    results: dict[str, list[dict]] = {name: [] for name in targets}
    for send, _ in targets.values():  # warm-up: first-call costs out of the numbers
        await send(min(8, tokens))
    total = sum(level * per_stream_at(level, per_stream, min_per_level) for level in levels) * len(targets)
    with tqdm(total=total, unit="req", desc=desc, file=sys.stderr, dynamic_ncols=True) as bar:
        for level in levels:
            n = per_stream_at(level, per_stream, min_per_level)
            for name, (send, chips) in targets.items():
                bar.set_description(f"{desc}: {name} x{level}")
                results[name].append(await run_level(send, name, level, tokens, n, chips, bar))
    return results


async def sweep(args) -> dict[str, list[dict]]:
    import httpx

    from clients.sdk import AsyncClient
    from serve.config import load_config

    chips = lane_chips(load_config(args.config), args.layout)
    if args.api == "openai":
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=600, limits=limits) as http:
            targets = {lane: (bind(openai_request, http, *LANES[lane], args.workload), chips[lane])
                       for lane in args.lanes}
            return await sweep_targets(targets, args.levels, args.tokens, args.requests_per_stream, "lanes/http",
                                       args.min_requests_per_level)
    async with AsyncClient(args.url, api_key=args.api_key) as client:
        targets = {lane: (bind(websocket_request, client, *LANES[lane], args.workload), chips[lane])
                   for lane in args.lanes}
        return await sweep_targets(targets, args.levels, args.tokens, args.requests_per_stream, "lanes",
                                   args.min_requests_per_level)


def bind(request, conn, model: str, tier: str | None, workload: str = "completion") -> Callable[[int], Awaitable[dict]]:
    """``send(tokens)`` for ``run_level``: one ``bench.targets`` request of ``workload`` on ``conn`` to
    ``model`` and ``tier``."""
    return lambda tokens: request(conn, model, tier, tokens, workload)


def lanes_main(args, argv: list[str]) -> int:
    from serve.config import load_config

    if args.quick:
        args.levels = args.levels or QUICK["levels"]
        args.tokens = args.tokens or QUICK["tokens"]
        args.requests_per_stream = args.requests_per_stream or QUICK["requests_per_stream"]
    args.levels = args.levels or LEVELS
    args.tokens = args.tokens or 128
    args.requests_per_stream = args.requests_per_stream or 3
    args.min_requests_per_level = 0 if args.quick else MIN_REQUESTS_PER_LEVEL
    args.layout = served_layout(args.url)
    if args.workload == "auto":
        args.workload = workload_for(load_config(args.config).models.full.path)
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    results = asyncio.run(sweep(args))
    elapsed = time.perf_counter() - t0
    head = headline(results)
    config = load_config(args.config)
    doc = {
        "benchmark": "lanes under load",
        "command": shlex.join(["fastmode", "bench", "lanes", *argv]),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "elapsed_s": elapsed,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "processor": platform.processor() or None},
        "settings": {"url": args.url, "levels": args.levels, "max_output_tokens": args.tokens,
                     "requests_per_stream": args.requests_per_stream,
                     "min_requests_per_level": args.min_requests_per_level, "workload": args.workload,
                     "prompt": prompt_of(args.workload), "temperature": 0,
                     "ignore_eos": True, "allow_spill": False, "lanes": {l: {"model": m, "service_tier": t}
                                                                         for l, (m, t) in LANES.items()
                                                                         if l in args.lanes},
                     "api": args.api, "connection": CONNECTION[args.api]},
        "assumptions": {
            "chips": lane_chips(config, args.layout),
            "fast_layout": args.layout,
            "chips_rule": "fast: tp x pp x replicas (the executor's chip actors), tp x pp as the server's "
                          "/health reports them; priority, standard and exact: one chip per replica (one vLLM engine "
                          "each; on this CPU machine a chip is one engine replica, on a GPU machine one GPU), "
                          f"replicas from the config ({args.config or 'embedded default'}).",
            "closed_loop": "each of N workers sends its next request when its previous one ends; a request "
                           "rejected as overloaded waits retry_after and is sent again (counted in rejected); "
                           "never spilled",
            "per_user_decode_tokens_per_s": "(output_tokens - 1) / (end - first text delta), client side, "
                                            "over completed requests",
            "ttft_s": "client side: from sending response.create to the first text delta",
            "aggregate_tokens_per_s": "output tokens of the level / wall seconds of the level",
            "chip_seconds_per_1k_output_tokens": "chips x wall seconds of the level / (output tokens / 1000)",
            "cost_units_per_1k_output_tokens": "the server's cost_units (price x (input + output) / 1000; "
                                               "price standard 1, priority 6, exact 6, fast 1) per 1k output "
                                               "tokens",
            "ratios": "within this run only; standard's saturating load = its level with the highest "
                      "aggregate tokens/s; priority, exact and fast speed at the lowest level (exact also "
                      "against priority's there); cost ratios at each "
                      "lane's own saturating level",
        },
        "lanes": results,
        "headline": head,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "lanes_load" if args.api == "websocket" else "lanes_load_openai"
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(results, out / f"{stem}.png", f"fastmode lanes under load ({args.api}): {args.tokens} tokens/request, "
         f"{args.requests_per_stream} per stream, {doc['date']}, {os.cpu_count()} CPUs")
    print(summary(results, head))
    print(f"\nwrote {out / stem}.json and {out / stem}.png ({elapsed:.0f} s)")
    return 0


def int_list(s: str) -> list[int]:
    try:
        values = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return values


def _lanes(s: str) -> list[str]:
    lanes = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in lanes if x not in LANES]
    if bad or not lanes:
        raise argparse.ArgumentTypeError(f"unknown lane(s) {bad}; choose from {list(LANES)}")
    return lanes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="fastmode bench lanes", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="the gateway (default ws://127.0.0.1:8000, or "
                    "http://127.0.0.1:8000 with --api openai)")
    ap.add_argument("--api", choices=list(CONNECTION), default="websocket", help="the front door: the "
                    "persistent WebSocket with the SDK (default), or the OpenAI-compatible HTTP API "
                    "(/v1/completions over SSE), the path vLLM's own server is measured on")
    ap.add_argument("--api-key", default=None, help="API key (default: $FASTMODE_API_KEY)")
    ap.add_argument("--levels", type=int_list, default=None, help="concurrency levels (default 1,4,8,16,32; "
                    "--quick 1,2)")
    ap.add_argument("--tokens", type=int, default=None, help="max_output_tokens per request (default 128; "
                    "--quick 16)")
    ap.add_argument("--requests-per-stream", type=int, default=None, help="completed requests per worker "
                    "(default 3; --quick 1)")
    ap.add_argument("--lanes", type=_lanes, default=list(LANES), help="lanes to run (default "
                    "standard,priority,fast,exact)")
    ap.add_argument("--config", default=None, help="the app's config file, for each lane's chips "
                    "(default: the embedded default)")
    ap.add_argument("--workload", choices=["auto", *WORKLOADS], default="auto", help="chat: one user message "
                    "through the chat template; completion: raw text (default auto: chat for a full model with "
                    "a chat template)")
    ap.add_argument("--quick", action="store_true", help="a tiny setting: levels 1,2, 16 tokens, "
                    "1 request per stream")
    ap.add_argument("--out", default="bench/results", help="directory for lanes_load.json and "
                    "lanes_load.png (default %(default)s)")
    args = ap.parse_args(argv)
    for name in ("tokens", "requests_per_stream"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.url is None:
        args.url = "ws://127.0.0.1:8000" if args.api == "websocket" else "http://127.0.0.1:8000"
    args.api_key = args.api_key or os.environ.get("FASTMODE_API_KEY")
    return lanes_main(args, argv)


if __name__ == "__main__":
    raise SystemExit(main())
