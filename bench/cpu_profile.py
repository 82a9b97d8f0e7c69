"""Where the CPU goes per token: each process of a running application, under a closed-loop load.

On a machine where the serving processes share the cores with the engine, a token's cost is the
CPU every process spends on it. This reads each process's CPU time (``/proc/PID/stat``: user +
system) before and after a load run of ``--streams`` closed-loop streams on one lane, over the
WebSocket (SDK) or the OpenAI API (SSE), and reports CPU milliseconds per output token for every
process that used any, grouped by role: each Serve replica by its deployment (``gateway``,
``standard-lane``, ...), a vLLM engine process (``VLLM::EngineCore``, its workers) under the lane
replica that started it, the fast lane's chips, Serve's controller and proxy, Ray's own daemons,
and the load generator itself (this process).

``--idle-s N`` sends nothing and reads the same over N seconds instead: what the application's
processes spend with no request, which a load's engine competes with on a machine with few cores.

Usage: python -m bench.cpu_profile [--url ws://127.0.0.1:8000] [--api websocket|openai]
       [--lane standard] [--streams 32] [--tokens 128] [--requests-per-stream 2] [--idle-s N]
       [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of ``pid``, or ``None`` if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def role(title: str) -> str | None:
    """The role a process's title names, or ``None`` for a process to attribute to its parent."""
    if title.startswith("ray::ServeReplica:"):
        return title.split(":")[-1].split()[0]  # ray::ServeReplica:APP:DEPLOYMENT
    for prefix, name in (("ray::ServeController", "serve controller"), ("ray::ProxyActor", "serve proxy"),
                         ("ray::ChipWorker", "fast-lane chips"), ("ray::", "other ray workers")):
        if title.startswith(prefix):
            return name
    for part, name in (("gcs_server", "ray daemons"), ("raylet", "ray daemons"), ("dashboard", "ray daemons"),
                       ("log_monitor", "ray daemons"), ("runtime_env", "ray daemons")):
        if part in title:
            return name
    return None


def snapshot(mine: str = "load generator") -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds) of every process; engines and helpers take their ancestor's role,
    this process and what it started without a role of its own ``mine``."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(int(p))) is not None}
    own = {pid: role(_title(pid)) for pid in stats}
    me = os.getpid()

    def resolve(pid: int) -> str:
        seen = pid
        while seen in stats:
            if seen == me:
                return mine
            if own.get(seen):
                name = own[seen]
                return f"{name} (+ engine)" if seen != pid and name.endswith("-lane") else name
            seen = stats[seen][0]
        return "other"

    return {pid: (resolve(pid), cpu) for pid, (_, cpu) in stats.items()}


def per_role(before: dict, after: dict) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for pid, (name, cpu) in after.items():
        out[name] += cpu - (before[pid][1] if pid in before else 0.0)
    return dict(out)


async def _load(args) -> dict:
    import httpx

    from bench.lanes import LANES, bind, run_level
    from bench.targets import openai_request, websocket_request
    from clients.sdk import AsyncClient

    model, tier = LANES[args.lane]
    if args.api == "openai":
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=600, limits=limits) as http:
            return await run_level(bind(openai_request, http, model, tier), args.lane, args.streams, args.tokens,
                                   args.requests_per_stream, 1)
    async with AsyncClient(args.url, api_key=args.api_key) as client:
        return await run_level(bind(websocket_request, client, model, tier), args.lane, args.streams, args.tokens,
                               args.requests_per_stream, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="default ws://127.0.0.1:8000 (http:// with --api openai)")
    ap.add_argument("--api", choices=["websocket", "openai"], default="websocket")
    ap.add_argument("--api-key", default=os.environ.get("FASTMODE_API_KEY"))
    ap.add_argument("--lane", default="standard", choices=["standard", "priority", "fast"])
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--idle-s", type=float, default=None, help="send nothing: read each process's CPU over "
                    "this many seconds of an idle application")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    args.url = args.url or ("http://127.0.0.1:8000" if args.api == "openai" else "ws://127.0.0.1:8000")
    before, t0 = snapshot(), time.perf_counter()
    if args.idle_s is not None:
        time.sleep(args.idle_s)
        row = {"output_tokens": 0, "aggregate_tokens_per_s": 0.0}
    else:
        row = asyncio.run(_load(args))
    wall, after = time.perf_counter() - t0, snapshot()
    cpu = per_role(before, after)
    tokens = row["output_tokens"]
    rows = sorted(((name, s) for name, s in cpu.items() if s > 0), key=lambda x: -x[1])
    per_token = (lambda s: f"{1000 * s / tokens:12.3f}") if tokens else (lambda s: f"{'-':>12s}")
    if args.idle_s is not None:
        print(f"idle for {wall:.1f} s; CPU per process:")
    else:
        print(f"{args.lane} lane, {args.streams} streams over {args.api}: {tokens} tokens in {wall:.1f} s "
              f"({row['aggregate_tokens_per_s']:.0f} tok/s); CPU per process:")
    print(f"{'process':28s} {'CPU s':>7s} {'% of a core':>11s} {'CPU ms/token':>12s}")
    for name, s in rows:
        print(f"{name:28s} {s:7.2f} {100 * s / wall:10.1f}% {per_token(s)}")
    total = sum(s for _, s in rows)
    print(f"{'total':28s} {total:7.2f} {100 * total / wall:10.1f}% {per_token(total)}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": " ".join(["python -m bench.cpu_profile", *(argv if argv is not None else sys.argv[1:])]),
            "lane": None if args.idle_s is not None else args.lane, "api": args.api,
            "streams": 0 if args.idle_s is not None else args.streams, "wall_s": wall, "output_tokens": tokens,
            "aggregate_tokens_per_s": row["aggregate_tokens_per_s"], "cores": os.cpu_count(),
            "cpu_s": dict(rows)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
