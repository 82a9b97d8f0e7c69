"""The standard lane and vLLM's own OpenAI server measured in alternation (``fastmode bench paired``).

``fastmode bench vllm`` (section 5 of docs/benchmarks.md) runs vLLM's server alone on the machine,
minutes before the lanes' own sweep. This machine's speed drifts by tens of percent over minutes,
so a ratio of two figures taken that far apart moves with the drift as much as with the servers.
Here both run at once, each idle while the other is measured, and every level is measured on one
then on the other, in rounds whose order flips (A B, B A, A B, ...): slow drift hits both alike,
and each round gives one ratio per level. The same load generator, requests and OpenAI API
(``/v1/completions`` over SSE) as section 5; vLLM's server is started as there
(``bench.vllm_serve.server_command``, its default batch cap).

What each side pays for the other being there: its idle processes (vLLM's API server and engine
core; the app's Ray daemons, idle replicas and engines) wake up now and then on the same cores.

Usage: fastmode bench paired [--url http://127.0.0.1:8000] [--api-key KEY] [--levels 1,16,32]
                             [--rounds 4] [--tokens 128] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from bench.lanes import int_list, sweep_targets
from bench.rounds import round_order
from bench.targets import openai_request

OURS, THEIRS = "standard", "vllm-full"
MODEL = "fastmode-full"
REQUESTS_PER_STREAM, MIN_REQUESTS_PER_LEVEL = 3, 12
"""As section 5's sweep (``bench.lanes``): each level completes at least 12 requests per server."""


def ratios(rounds: list[dict[str, list[dict]]]) -> dict[int, dict[str, Any]]:
    """Per level: ours over theirs, per-user (p50 of end-to-end tokens/s) and aggregate tokens/s, each
    round's and their median."""
    out: dict[int, dict[str, Any]] = {}
    for results in rounds:
        for a in results[OURS]:
            b = next(r for r in results[THEIRS] if r["concurrency"] == a["concurrency"])
            level = out.setdefault(a["concurrency"], {"per_user": [], "aggregate": []})
            level["per_user"].append(a["per_user_e2e_tokens_per_s"]["p50"] / b["per_user_e2e_tokens_per_s"]["p50"])
            level["aggregate"].append(a["aggregate_tokens_per_s"] / b["aggregate_tokens_per_s"])
    for level in out.values():
        level["per_user_median"] = statistics.median(level["per_user"])
        level["aggregate_median"] = statistics.median(level["aggregate"])
    return out


async def alternate(targets: dict[str, Callable[[int], Awaitable[dict]]], levels: list[int], rounds: int,
                    tokens: int, per_stream: int, min_per_level: int) -> list[dict[str, Any]]:
    """``rounds`` sweeps over both targets, the order flipping each round."""
    out = []
    for r in range(rounds):
        order = round_order(list(targets), r)
        results = await sweep_targets({n: (targets[n], 1) for n in order}, levels, tokens, per_stream,
                                      f"paired {r + 1}/{rounds}", min_per_level)
        out.append({"round": r + 1, "order": order, "results": results})
    return out


async def _measure(our_url: str, key: str | None, their_url: str, args) -> list[dict[str, Any]]:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=our_url, headers=headers, timeout=600, limits=limits) as ours, \
            httpx.AsyncClient(base_url=their_url, timeout=600, limits=limits) as theirs:
        targets = {OURS: lambda n: openai_request(ours, MODEL, None, n),
                   THEIRS: lambda n: openai_request(theirs, MODEL, None, n)}
        return await alternate(targets, args.levels, args.rounds, args.tokens, args.requests_per_stream,
                               args.min_requests_per_level)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="fastmode bench paired", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="fastmode's HTTP address (fastmode up)")
    ap.add_argument("--api-key", default=None, help="API key (default: $FASTMODE_API_KEY)")
    ap.add_argument("--levels", type=int_list, default=None, help="concurrency levels (default 1,16,32; --quick 1)")
    ap.add_argument("--rounds", type=int, default=None, help="alternations (default 4; --quick 2)")
    ap.add_argument("--tokens", type=int, default=None, help="max_tokens per request (default 128; --quick 16)")
    ap.add_argument("--quick", action="store_true", help="level 1, 2 rounds, 16 tokens, 2 requests a level")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    quick = dict(levels=[1], rounds=2, tokens=16) if args.quick else dict(levels=[1, 16, 32], rounds=4, tokens=128)
    for name, value in quick.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.rounds < 1 or args.tokens < 1:
        ap.error("--rounds and --tokens must be at least 1")
    args.requests_per_stream = 1 if args.quick else REQUESTS_PER_STREAM
    args.min_requests_per_level = 2 if args.quick else MIN_REQUESTS_PER_LEVEL
    key = args.api_key or os.environ.get("FASTMODE_API_KEY") or None

    from bench.vllm_serve import server_command, vllm_server

    started, t0 = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
    log = Path(args.json).with_suffix(".vllm.log") if args.json else Path(os.devnull)
    log.parent.mkdir(parents=True, exist_ok=True)
    with vllm_server("full", log) as their_url:
        rounds = asyncio.run(_measure(args.url.rstrip("/"), key, their_url, args))
    result = {"benchmark": "the standard lane and vLLM's own OpenAI server, alternating",
              "command": "fastmode bench paired " + shlex.join(argv), "date": started,
              "elapsed_s": time.perf_counter() - t0,
              "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
              "settings": {"levels": args.levels, "rounds": args.rounds, "tokens": args.tokens,
                           "requests_per_stream": args.requests_per_stream,
                           "min_requests_per_level": args.min_requests_per_level,
                           "server_command": shlex.join(server_command("full", "PORT"))},
              "rounds": rounds, "ratios": ratios([r["results"] for r in rounds])}
    for level, r in result["ratios"].items():
        print(f"{OURS} / {THEIRS}, {level} stream(s): per user {r['per_user_median']:.2f}x "
              f"(rounds {', '.join(f'{x:.2f}' for x in r['per_user'])}), aggregate {r['aggregate_median']:.2f}x "
              f"(rounds {', '.join(f'{x:.2f}' for x in r['aggregate'])})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
