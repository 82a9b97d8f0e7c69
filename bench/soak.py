"""``fastmode bench soak``: every delta accounted for under sustained mixed load, and nothing leaked.

Against a running application on loopback (bounded in count and time):

1. **WebSocket soak**: ``--streams`` concurrent streams spread over ``--connections`` persistent
   connections (several streams per connection), each stream sending ``--requests`` requests one
   after the other: mixed tiers (fast, priority, standard, exact, auto), mixed lengths, some
   cancelled after their first delta, some connections reading slowly, and a few connections reset
   mid-stream (TCP RST, no close frame). Every request with ``ignore_eos`` must end in exactly one
   terminal event (``response.completed``, ``response.cancelled`` or ``error``), with its deltas
   numbered 0, 1, 2, ... without a gap or a repeat, nothing after its end, and, when completed, as
   many tokens in its deltas as its usage says (and as it asked for).
2. **OpenAI SSE** and **gRPC** soaks with fewer streams: ``[DONE]`` (or gRPC's ``last`` chunk)
   exactly once and last, ``seq`` without gaps on gRPC, completion tokens as asked.
3. **Afterwards**: every lane's engine holds no sequence (``running`` 0, ``in_flight`` 0 on
   ``/health``), and the application's processes' memory (RSS of its Serve replicas and engine
   processes, this machine only) is back within ``--memory-slack`` of where it was after a warm-up
   pass.
4. **Disconnect frees work**: per lane and front door, a long request whose client vanishes after its
   first token (a TCP reset on the WebSocket and SSE; a killed client process on gRPC), and the
   time until the lane's engine no longer holds it.
5. **Faults** (``--kill chip`` / ``--kill engine``, this machine only): ``--kill-after-s`` into the
   WebSocket soak, a fast-lane chip process (or the standard lane's vLLM engine process) is killed
   with SIGKILL. The requests the lane had in flight must end with a retryable error within 5 s (or
   have completed), every request still ends exactly once, and a new request to the lane completes
   within 30 s, without restarting the application. The memory check is skipped (the rebuilt
   engine's memory is new).

Writes ``--json``; exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import shlex
import socket
import struct
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

TIERS = {"fast": {"model": "fastmode-fast"},
         "priority": {"model": "fastmode-full", "service_tier": "priority", "allow_spill": True},
         "standard": {"model": "fastmode-full"},
         "exact": {"model": "fastmode-full", "service_tier": "exact"},
         "auto": {"model": "auto"}}
"""What each tier's request carries (priority spills to standard when full rather than erroring)."""
LANES = ("fast", "priority", "standard", "exact")
PROMPTS = ("def main():\n", "import os\nimport sys\n\n\ndef read_config(path):\n",
           "class Node:\n    def __init__(self, value, children=None):\n",
           "for i in range(10):\n    if i % 2 == 0:\n")
LENGTHS = (4, 16, 48)
PROCESS_MARKS = ("ServeReplica:", "VLLM::EngineCore", "ray::ChipWorker")
"""The application's processes on this machine whose memory the soak follows."""
KILLS = {"chip": ("fast", "ray::ChipWorker", None),
         "engine": ("standard", "VLLM::EngineCore", "ServeReplica:fastmode:standard-lane")}
"""``--kill``: the lane, and the process killed (its command line's mark, below a process whose
command line has the second mark, if any)."""
ERROR_WITHIN_S, SERVED_AGAIN_WITHIN_S = 5.0, 30.0
"""Issue 18's contract for a killed chip or engine."""


def app_processes(port: int) -> list | None:
    """The processes under the Ray node (raylet) of the process listening on ``port`` on this machine
    (``None`` if no process here listens there)."""
    import psutil

    listening = [c.pid for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid]
    if not listening:
        return None
    try:
        node = psutil.Process(listening[0]).parent()
        return node.children(recursive=True) if node is not None else []
    except psutil.Error:
        return None


def _cmdline(p) -> str:
    import psutil

    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def victim(port: int, kill: str):
    """The process ``--kill`` names, in the application listening on ``port`` (``None``: none here)."""
    _, mark, under = KILLS[kill]
    procs = app_processes(port) or []
    if under is not None:
        procs = [c for p in procs if under in _cmdline(p) for c in p.children(recursive=True)]
    found = [p for p in procs if mark in _cmdline(p)]
    return found[-1] if found else None


def app_rss(port: int) -> int | None:
    """Bytes resident in the processes of the application listening on ``port`` on this machine:
    every Serve replica, engine and chip process under the Ray node (raylet) of the process that
    listens there (``None`` if no process here does)."""
    import psutil

    procs = app_processes(port)
    if procs is None:
        return None
    total = 0
    for p in procs:
        try:
            if any(mark in " ".join(p.cmdline()) for mark in PROCESS_MARKS):
                total += p.memory_info().rss
        except psutil.Error:  # gone meanwhile
            pass
    return total


class Ledger:
    """Every request's events, checked as they arrive."""

    def __init__(self) -> None:
        self.requests: dict[str, dict[str, Any]] = {}
        self.problems: list[str] = []

    def start(self, rid: str, door: str, tier: str, tokens: int) -> None:
        self.requests[rid] = {"door": door, "tier": tier, "asked": tokens, "seq": 0, "tokens": 0, "end": None,
                              "abandoned": False, "text": "", "cancel_sent": False, "late_cancel": False}

    def problem(self, rid: str, what: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(f"{rid}: {what}")
        else:
            self.problems.append("...")

    def ws_event(self, ev: dict[str, Any]) -> bool:
        """Account one WebSocket event; ``True`` if it ended its request."""
        rid = ev.get("id")
        r = self.requests.get(rid)
        if r is None:
            self.problem(str(rid), f"an event for an unknown request: {ev['type']}")
            return False
        if r["end"] is not None:
            if ev["type"] == "error" and ev.get("code") == "unknown_id" and r["cancel_sent"]:
                r["late_cancel"] = True  # our cancel crossed its completion: the server says so, fine
            else:
                self.problem(rid, f"{ev['type']} {ev.get('code', '')} after its end ({r['end']})")
            return False
        kind = ev["type"]
        if kind == "response.created":
            r["lane"] = ev.get("lane")
        elif kind == "response.output_text.delta":
            if ev["seq"] != r["seq"]:
                self.problem(rid, f"delta seq {ev['seq']}, expected {r['seq']}")
            r["seq"] = ev["seq"] + 1
            r["tokens"] += ev["tokens"]
            r["text"] += ev["delta"]
        elif kind in ("response.completed", "response.cancelled", "error"):
            r["end"] = "completed" if kind == "response.completed" else "cancelled" if kind == "response.cancelled" \
                else f"error:{ev['code']}"
            r["end_at"] = time.monotonic()
            if kind == "error":
                r["retry_after"] = ev.get("retry_after")
            if kind == "response.completed":
                self.completed(rid, ev["usage"]["output_tokens"])
            return True
        return False

    def completed(self, rid: str, output_tokens: int) -> None:
        r = self.requests[rid]
        if r["door"] != "sse" and r["tokens"] != output_tokens:  # SSE chunks do not carry token counts
            self.problem(rid, f"deltas carried {r['tokens']} tokens, usage says {output_tokens}")
        if output_tokens != r["asked"]:
            self.problem(rid, f"asked for {r['asked']} tokens (ignore_eos), usage says {output_tokens}")

    def summary(self) -> dict[str, Any]:
        ends = Counter(r["end"] or ("abandoned" if r["abandoned"] else "none") for r in self.requests.values())
        lost = [rid for rid, r in self.requests.items() if r["end"] is None and not r["abandoned"]]
        for rid in lost[:10]:
            self.problem(rid, "no terminal event")
        by_door = defaultdict(Counter)
        for r in self.requests.values():
            by_door[r["door"]][r["end"] or ("abandoned" if r["abandoned"] else "none")] += 1
        return {"requests": len(self.requests), "ends": dict(ends),
                "cancels_after_the_end": sum(r["late_cancel"] for r in self.requests.values()), "by_door": {k: dict(v) for k, v in by_door.items()},
                "deltas": sum(r["seq"] for r in self.requests.values()),
                "tokens": sum(r["tokens"] for r in self.requests.values()),
                "without_terminal": len(lost), "problems": self.problems}


def _body(tier: str, prompt: str, tokens: int) -> dict[str, Any]:
    return {"input": prompt, "max_output_tokens": tokens, "temperature": 0, "ignore_eos": True, **TIERS[tier]}


def _rst(transport) -> None:
    """Reset the connection (RST, not FIN): the client vanished."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


# -- the WebSocket soak ------------------------------------------------------------------------
async def ws_connection(url: str, key: str | None, ledger: Ledger, cid: int, streams: int, requests: int,
                        rng: random.Random, slow: bool, reset_after: int | None, cancel_p: float) -> None:
    from websockets.asyncio.client import connect

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with connect(url, additional_headers=headers, max_size=None, open_timeout=30) as ws:
        waiting: dict[str, asyncio.Future] = {}
        first_delta: dict[str, asyncio.Event] = {}
        sent = 0
        reset = asyncio.Event()
        tasks: list[asyncio.Task] = []

        async def reader() -> None:
            async for raw in ws:
                if slow:
                    await asyncio.sleep(0.02)
                ev = json.loads(raw)
                rid = ev.get("id")
                if ev["type"] == "response.output_text.delta" and rid in first_delta:
                    first_delta[rid].set()
                if ledger.ws_event(ev) and rid in waiting:
                    waiting.pop(rid).set_result(None)

        async def stream(sid: int) -> None:
            nonlocal sent
            for n in range(requests):
                if reset.is_set():
                    return
                tier = rng.choice(list(TIERS))
                tokens = rng.choice(LENGTHS)
                rid = f"c{cid}s{sid}r{n}"
                ledger.start(rid, "ws", tier, tokens)
                done = waiting[rid] = asyncio.get_running_loop().create_future()
                first_delta[rid] = asyncio.Event()
                await ws.send(json.dumps({"type": "response.create", "id": rid,
                                          **_body(tier, rng.choice(PROMPTS), tokens)}))
                sent += 1
                if reset_after is not None and sent >= reset_after:
                    # after its first delta (or its end: under --kill a request may end in an error at once)
                    got = asyncio.ensure_future(first_delta[rid].wait())
                    finished, _ = await asyncio.wait({got, done}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
                    got.cancel()
                    if not finished:
                        raise TimeoutError(f"{rid}: neither a first delta nor an end within 120 s")
                    for r in waiting:
                        ledger.requests[r]["abandoned"] = True
                    reset.set()
                    _rst(ws.transport)
                    for t in tasks:  # the connection's other streams vanish with it
                        if t is not asyncio.current_task():
                            t.cancel()
                    return
                if rng.random() < cancel_p:
                    got = asyncio.ensure_future(first_delta[rid].wait())
                    await asyncio.wait({got, done}, return_when=asyncio.FIRST_COMPLETED)
                    got.cancel()
                    if not done.done():
                        ledger.requests[rid]["cancel_sent"] = True
                        await ws.send(json.dumps({"type": "response.cancel", "id": rid}))
                await asyncio.wait_for(done, 300)

        read = asyncio.create_task(reader())
        tasks.extend(asyncio.create_task(stream(s)) for s in range(streams))
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
            if errors and not reset.is_set():
                raise errors[0]
        finally:
            read.cancel()
            await asyncio.gather(read, return_exceptions=True)


async def ws_soak(url: str, key: str | None, args: argparse.Namespace, ledger: Ledger) -> dict[str, Any]:
    rng = random.Random(args.seed)
    per = max(1, args.streams // args.connections)
    slow = set(rng.sample(range(args.connections), max(1, round(args.connections * args.slow_fraction))))
    resets = set(rng.sample(sorted(set(range(args.connections)) - slow), min(args.resets, args.connections - len(slow))))
    t0 = time.perf_counter()
    results = await asyncio.gather(*(
        ws_connection(url, key, ledger, c, per, args.requests, random.Random(args.seed * 1000 + c), c in slow,
                      rng.randint(2, per * args.requests) if c in resets else None, args.cancel_fraction)
        for c in range(args.connections)), return_exceptions=True)
    failures = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return {"connections": args.connections, "streams": per * args.connections, "requests_per_stream": args.requests,
            "slow_connections": len(slow), "reset_connections": len(resets), "seconds": time.perf_counter() - t0,
            "client_failures": failures}


# -- faults ------------------------------------------------------------------------------------
async def kill_during(base: str, key: str | None, port: int, kill: str, after_s: float, ledger: Ledger
                      ) -> dict[str, Any]:
    """``after_s`` into the soak, SIGKILL ``kill``'s process; then a 4-token request to its lane every
    0.5 s until one completes. Returns what happened (``judge_kill`` reads the ledger for the rest)."""
    lane = KILLS[kill][0]
    await asyncio.sleep(after_s)
    proc = await asyncio.to_thread(victim, port, kill)
    if proc is None:
        return {"kill": kill, "lane": lane, "error": "no such process of the application on this machine"}
    in_flight = [rid for rid, r in ledger.requests.items()
                 if r.get("lane") == lane and r["end"] is None and not r["abandoned"]]
    killed_at = time.monotonic()
    proc.kill()
    body = {"input": "x = 1\n", "max_output_tokens": 4, "temperature": 0,
            **{"fast": TIERS["fast"], "standard": TIERS["standard"]}[lane]}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    refusals: Counter = Counter()
    served_s = None
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as client:
        while time.monotonic() - killed_at < 120:
            last: dict[str, Any] = {}
            try:
                async with client.stream("POST", "/v1/generate", json=body) as resp:
                    async for line in resp.aiter_lines():
                        if line.strip():
                            last = json.loads(line)
            except httpx.HTTPError as e:
                last = {"code": type(e).__name__}
            if last.get("type") == "done":
                served_s = time.monotonic() - killed_at
                break
            refusals[str(last.get("code") or (last.get("error") or {}).get("code"))] += 1
            await asyncio.sleep(0.5)
    return {"kill": kill, "lane": lane, "pid": proc.pid, "killed_at": killed_at, "in_flight": in_flight,
            "served_again_s": served_s, "refusals_meanwhile": dict(refusals)}


def judge_kill(fault: dict[str, Any], ledger: Ledger) -> dict[str, Any]:
    """How the requests the lane had in flight at the kill ended, and whether the fault contract held (a retryable error within 5 s, served again within 30 s)."""
    if "error" in fault:
        return {**fault, "ok": False}
    ends = Counter()
    latest_error_s, without_hint = 0.0, 0
    for rid in fault["in_flight"]:
        r = ledger.requests[rid]
        ends[r["end"] or ("abandoned" if r["abandoned"] else "none")] += 1
        if r["end"] and r["end"].startswith("error:"):
            latest_error_s = max(latest_error_s, r["end_at"] - fault["killed_at"])
            without_hint += not r.get("retry_after")
    # a retryable error, or an end of the request's own (the client cancelled or vanished, or it completed)
    errors_ok = not without_hint and set(ends) <= {"completed", "cancelled", "abandoned", "error:lane_unavailable"}
    ok = errors_ok and latest_error_s < ERROR_WITHIN_S and fault["served_again_s"] is not None \
        and fault["served_again_s"] < SERVED_AGAIN_WITHIN_S
    return {**{k: v for k, v in fault.items() if k not in ("in_flight", "killed_at")},
            "in_flight_at_kill": len(fault["in_flight"]), "their_ends": dict(ends),
            "errors_without_retry_after": without_hint, "latest_error_s": round(latest_error_s, 3), "ok": ok}


# -- OpenAI SSE and gRPC ------------------------------------------------------------------------
async def sse_soak(base: str, key: str | None, args: argparse.Namespace, ledger: Ledger) -> dict[str, Any]:
    rng = random.Random(args.seed + 1)
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def one(client: httpx.AsyncClient, sid: int, n: int) -> None:
        tier, tokens, prompt = rng.choice(list(TIERS)), rng.choice(LENGTHS), rng.choice(PROMPTS)
        rid = f"sse{sid}r{n}"
        ledger.start(rid, "sse", tier, tokens)
        body = {"model": TIERS[tier]["model"], "messages": [{"role": "user", "content": prompt}], "stream": True,
                "stream_options": {"include_usage": True}, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                **({"service_tier": TIERS[tier]["service_tier"]} if "service_tier" in TIERS[tier] else {})}
        cancel = rng.random() < args.cancel_fraction
        r = ledger.requests[rid]
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                r["end"] = f"error:{resp.json().get('error', {}).get('code')}"
                return
            finishes, usage, done = 0, None, False
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if done:
                    ledger.problem(rid, f"data after [DONE]: {data[:60]}")
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    r["end"] = f"error:{chunk['error'].get('code')}"
                    return
                for c in chunk.get("choices", []):
                    r["text"] += c["delta"].get("content") or ""
                    finishes += c.get("finish_reason") is not None
                usage = chunk.get("usage") or usage
                if cancel and r["text"]:
                    r["end"] = "cancelled"
                    return  # leaving the block closes the connection: the server cancels
            if not done or finishes != 1 or usage is None:
                ledger.problem(rid, f"[DONE] {done}, {finishes} finish_reason chunks, usage {usage}")
            r["end"] = "completed"
            ledger.completed(rid, usage["completion_tokens"] if usage else -1)

    async def stream(sid: int) -> None:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=300) as client:
            for n in range(args.requests):
                await one(client, sid, n)

    t0 = time.perf_counter()
    results = await asyncio.gather(*(stream(s) for s in range(args.sse_streams)), return_exceptions=True)
    return {"streams": args.sse_streams, "requests_per_stream": args.requests, "seconds": time.perf_counter() - t0,
            "client_failures": [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]}


async def grpc_soak(target: str, key: str | None, args: argparse.Namespace, ledger: Ledger) -> dict[str, Any]:
    import grpc

    from clients.grpc_client import error_code, request
    from serve.rpc import inference_pb2_grpc as pb_grpc

    rng = random.Random(args.seed + 2)
    metadata = (("authorization", f"Bearer {key}"),) if key else ()

    async def stream(stub, sid: int) -> None:
        for n in range(args.requests):
            tier, tokens, prompt = rng.choice(list(TIERS)), rng.choice(LENGTHS), rng.choice(PROMPTS)
            rid = f"grpc{sid}r{n}"
            ledger.start(rid, "grpc", tier, tokens)
            r = ledger.requests[rid]
            params = {k: v for k, v in TIERS[tier].items() if k != "model"}
            call = stub.Generate(request(TIERS[tier]["model"], prompt, max_output_tokens=tokens, temperature=0.0,
                                         ignore_eos=True, **params), metadata=metadata, timeout=300)
            cancel = rng.random() < args.cancel_fraction
            try:
                async for chunk in call:
                    if r["end"] is not None:
                        ledger.problem(rid, "a chunk after the last")
                    if chunk.seq != r["seq"]:  # text chunks count from 0; the last one carries the count
                        ledger.problem(rid, f"seq {chunk.seq}, expected {r['seq']}")
                    if not chunk.last:
                        r["seq"] = chunk.seq + 1
                        r["text"] += chunk.delta
                    if chunk.last:
                        r["end"] = "completed"
                        r["tokens"] = chunk.usage.output_tokens
                        ledger.completed(rid, chunk.usage.output_tokens)
                    elif cancel:
                        call.cancel()
                        r["end"] = "cancelled"
                        break
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.CANCELLED and cancel:
                    r["end"] = "cancelled"
                else:
                    r["end"] = f"error:{error_code(e) or e.code().name}"

    t0 = time.perf_counter()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceStub(channel)
        results = await asyncio.gather(*(stream(stub, s) for s in range(args.grpc_streams)), return_exceptions=True)
    return {"streams": args.grpc_streams, "requests_per_stream": args.requests, "seconds": time.perf_counter() - t0,
            "client_failures": [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]}


# -- engines idle, memory ------------------------------------------------------------------------
def engines_idle(base: str, key: str | None, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll ``/health`` until no lane holds a sequence; how long that took and what it showed."""
    t0 = time.perf_counter()
    with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {key}"} if key else {}) as c:
        while True:
            lanes = c.get("/health").json()["lanes"]
            busy = {n: {k: v.get(k) for k in ("running", "in_flight", "front_door_in_flight")}
                    for n, v in lanes.items()
                    if v.get("running") or v.get("in_flight") or v.get("front_door_in_flight")}
            if not busy or time.perf_counter() - t0 > timeout_s:
                return {"idle": not busy, "seconds": round(time.perf_counter() - t0, 3), "busy": busy,
                        "lanes": {n: {k: v.get(k) for k in ("running", "in_flight", "cancelled")}
                                  for n, v in lanes.items()}}
            time.sleep(0.1)


# -- disconnects ------------------------------------------------------------------------------
VANISH_TOKENS = 480
"""A vanishing client's request length (within the fast model's 512-token context): it would stream
for about half a second on the fast lane and seconds on the others had its client stayed."""


async def _wait_running(client: httpx.AsyncClient, lane: str, want_busy: bool, timeout_s: float) -> float | None:
    """Seconds until the lane's engine holds a sequence (``want_busy``) or none; ``None`` on timeout."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        running = (await client.get("/health")).json()["lanes"][lane].get("running", 0)
        if bool(running) == want_busy:
            return time.perf_counter() - t0
        await asyncio.sleep(0.005)
    return None


async def _first(on_first) -> None:
    if on_first is not None:
        await on_first()


async def vanish_ws(url: str, key: str | None, lane: str, on_first=None) -> None:
    from websockets.asyncio.client import connect

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    ws = await connect(url, additional_headers=headers, max_size=None)
    await ws.send(json.dumps({"type": "response.create", "id": "vanish", **_body(lane, PROMPTS[1], VANISH_TOKENS)}))
    async for raw in ws:
        event = json.loads(raw)
        if event["type"] == "error":
            raise RuntimeError(f"the request failed: {event}")
        if event["type"] == "response.output_text.delta":
            break
    await _first(on_first)
    _rst(ws.transport)


async def vanish_sse(base: str, key: str | None, lane: str, on_first=None) -> None:
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps({"model": TIERS[lane]["model"], "prompt": PROMPTS[1], "max_tokens": VANISH_TOKENS, "stream": True,
                       "temperature": 0, "ignore_eos": True,
                       **({"service_tier": TIERS[lane]["service_tier"]} if "service_tier" in TIERS[lane] else {})})
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    await writer.drain()
    seen = b""
    while not re.search(rb'"text": ?"[^"]', seen):  # the first chunk with text
        chunk = await reader.read(4096)
        if not chunk or seen.startswith(b"HTTP/1.1 4") or b'"error"' in seen:
            raise ConnectionError(f"the request failed: {(seen + chunk)[-300:]!r}")
        seen += chunk
    await _first(on_first)
    _rst(writer.transport)


GRPC_VANISH = """
import sys, time
from clients.grpc_client import GrpcClient
client = GrpcClient(sys.argv[1], api_key=sys.argv[2] or None)
for chunk in client.stream(sys.argv[3], sys.argv[4], max_output_tokens=int(sys.argv[6]), temperature=0.0, ignore_eos=True,
                           **({"service_tier": sys.argv[5]} if sys.argv[5] else {})):
    if chunk.delta:
        print("first", flush=True)
        time.sleep(3600)
"""


async def vanish_grpc(target: str, key: str | None, lane: str, on_first=None) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", GRPC_VANISH, target, key or "", TIERS[lane]["model"], PROMPTS[1],
        TIERS[lane].get("service_tier", ""), str(VANISH_TOKENS), cwd=str(Path(__file__).resolve().parents[1]),
        stdout=asyncio.subprocess.PIPE)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        if line.strip() != b"first":
            raise RuntimeError(f"the gRPC client ended before its first token: {line!r}")
        await _first(on_first)
    finally:
        proc.kill()
        await proc.wait()


def cancelled(stats: dict[str, Any]) -> int:
    """A lane's streams closed before their end, from its ``/health`` stats: on the fast lane the
    requests its ring dropped, whichever client sent them (front doors stream from its head chip
    themselves, ``serve.lanes.head_links``: the replica sees none of theirs); elsewhere the replica's count."""
    return stats["ring_aborted"] if "ring_aborted" in stats else stats.get("cancelled", 0)


async def disconnects(base: str, ws_url: str, grpc_target: str | None, key: str | None,
                      lanes: list[str], doors: list[str], hold=None) -> list[dict[str, Any]]:
    """Per lane and front door: seconds from the client's vanishing to the engine holding nothing.

    ``hold(lane)``, where given (the tests' ``App.paused``), is a context manager that stops the
    lane's engine; it is entered at the first token, before the client vanishes, and left once the
    disconnect has reached the engine (its ``reached_engine()``), so the stream cannot reach its end
    first on a loaded machine. ``freed_s`` then counts from the engine's resumption."""
    out = []
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
        for door in doors:
            if door == "grpc" and not grpc_target:
                continue
            for lane in lanes:
                if await _wait_running(client, lane, False, 30) is None:
                    out.append({"door": door, "lane": lane, "error": "the lane was busy before the test"})
                    continue
                held, pauses = contextlib.ExitStack(), []

                async def on_first(lane=lane, held=held, pauses=pauses):
                    if hold is not None:
                        pauses.append(held.enter_context(hold(lane)))

                vanish = {"ws": lambda: vanish_ws(ws_url, key, lane, on_first),
                          "sse": lambda: vanish_sse(base, key, lane, on_first),
                          "grpc": lambda: vanish_grpc(grpc_target, key, lane, on_first)}[door]
                before = cancelled((await client.get("/health")).json()["lanes"][lane])
                with held:  # the engine resumes on leaving, once the disconnect has reached it
                    try:
                        await asyncio.wait_for(vanish(), 120)
                        for paused in pauses:
                            await asyncio.to_thread(paused.reached_engine)
                    except Exception as e:  # noqa: BLE001 - reported in the results
                        out.append({"door": door, "lane": lane, "error": f"{type(e).__name__}: {e}"[:300]})
                        continue
                gone = time.perf_counter()
                freed = await _wait_running(client, lane, False, 30)
                took = time.perf_counter() - gone
                after = cancelled((await client.get("/health")).json()["lanes"][lane])
                # ``cancelled`` counts streams closed before their end: it proves the sequence was
                # freed by the disconnect, not by reaching its last token.
                out.append({"door": door, "lane": lane, "freed_s": None if freed is None else round(took, 4),
                            "cancelled_by_disconnect": after - before == 1})
    return out


# -- main ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="fastmode bench soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the running application (loopback)")
    ap.add_argument("--grpc", default=os.environ.get("FASTMODE_GRPC_TARGET") or None,
                    help="its gRPC address (HOST:PORT; default $FASTMODE_GRPC_TARGET, else the HTTP host's port "
                    "9000 if it answers)")
    ap.add_argument("--api-key", default=os.environ.get("FASTMODE_API_KEY"))
    ap.add_argument("--streams", type=int, default=200, help="concurrent WebSocket streams")
    ap.add_argument("--connections", type=int, default=20, help="WebSocket connections they share")
    ap.add_argument("--requests", type=int, default=10, help="requests per stream, one after the other")
    ap.add_argument("--sse-streams", type=int, default=16)
    ap.add_argument("--grpc-streams", type=int, default=16)
    ap.add_argument("--cancel-fraction", type=float, default=0.1)
    ap.add_argument("--slow-fraction", type=float, default=0.1, help="connections that read slowly")
    ap.add_argument("--resets", type=int, default=2, help="connections reset (TCP RST) mid-stream")
    ap.add_argument("--memory-slack", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kill", choices=sorted(KILLS), action="append", default=[],
                    help="kill a fast-lane chip process or the standard lane's vLLM engine during the WebSocket soak "
                    "(repeatable; the application must run on this machine)")
    ap.add_argument("--kill-after-s", type=float, default=5.0, help="seconds into the WebSocket soak")
    ap.add_argument("--quick", action="store_true", help="20 streams x 3 requests, 4 SSE and gRPC streams")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.streams, args.connections, args.requests, args.sse_streams, args.grpc_streams = 20, 4, 3, 4, 4
    base = args.url.rstrip("/").replace("ws://", "http://", 1)
    ws_url = "ws" + base[4:] + "/v1/responses"
    grpc_target = args.grpc
    if grpc_target is None:
        host = base.removeprefix("http://").split(":")[0]
        with socket.socket() as s:
            grpc_target = f"{host}:9000" if s.connect_ex((host, 9000)) == 0 else None
    started = time.strftime("%Y-%m-%d %H:%M")

    async def run() -> dict[str, Any]:
        warm = Ledger()  # a warm-up pass: what the first requests allocate is not a leak
        w = argparse.Namespace(**{**vars(args), "streams": 5, "connections": 1, "requests": 2, "resets": 0,
                                  "slow_fraction": 0})
        await ws_soak(ws_url, args.api_key, w, warm)
        time.sleep(2)
        port = int(base.rsplit(":", 1)[1])
        rss_before = app_rss(port)
        ledger = Ledger()
        faults = [asyncio.ensure_future(kill_during(base, args.api_key, port, k, args.kill_after_s * (i + 1), ledger))
                  for i, k in enumerate(args.kill)]
        ws = await ws_soak(ws_url, args.api_key, args, ledger)
        killed = [judge_kill(f, ledger) for f in await asyncio.gather(*faults)]
        sse = await sse_soak(base, args.api_key, args, ledger)
        grpc_ = await grpc_soak(grpc_target, args.api_key, args, ledger) if grpc_target else None
        idle = engines_idle(base, args.api_key)
        time.sleep(5)
        rss_after = app_rss(port)
        gone = await disconnects(base, ws_url, grpc_target, args.api_key, list(LANES),
                                 ["ws", "sse", "grpc"] if not args.quick else ["ws"])
        return {"ws": ws, "sse": sse, "grpc": grpc_, "ledger": ledger.summary(), "engines_after": idle,
                "memory": {"before_bytes": rss_before, "after_bytes": rss_after,
                           "ratio": rss_after / rss_before if rss_before and rss_after else None},
                "disconnects": gone, "faults": killed}

    result = asyncio.run(run())
    led, mem = result["ledger"], result["memory"]
    failures = result["ws"]["client_failures"] + result["sse"]["client_failures"] + \
        (result["grpc"]["client_failures"] if result["grpc"] else [])
    checks = {"every request ended exactly once, deltas in order": not led["problems"] and not led["without_terminal"],
              "no client failed": not failures,
              "engines hold nothing afterwards": result["engines_after"]["idle"],
              f"memory within {args.memory_slack:.0%}": mem["ratio"] is None or mem["ratio"] <= 1 + args.memory_slack,
              "every vanished client's sequence freed": all(d.get("freed_s") is not None and d["cancelled_by_disconnect"]
                                                           for d in result["disconnects"])}
    if args.kill:  # a rebuilt engine's memory is new: not comparable
        del checks[f"memory within {args.memory_slack:.0%}"]
    for f in result["faults"]:
        checks[f"killed {f['kill']}: in-flight requests ended retryably within {ERROR_WITHIN_S:.0f} s, "
               f"served again within {SERVED_AGAIN_WITHIN_S:.0f} s"] = f["ok"]
    out = {"date": started, "command": "fastmode bench soak " + shlex.join(argv),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
           "settings": {k: v for k, v in vars(args).items() if k not in ("api_key", "json")},
           **result, "checks": checks, "passed": all(checks.values())}
    print(f"soak: {led['requests']} requests ({result['ws']['streams']} WebSocket streams on "
          f"{result['ws']['connections']} connections, {args.sse_streams} SSE, {args.grpc_streams if grpc_target else 0} "
          f"gRPC), ends {led['ends']}, {led['deltas']} deltas, {len(led['problems'])} problems, "
          f"{led['without_terminal']} without an end")
    print(f"engines idle after {result['engines_after']['seconds']} s: {result['engines_after']['idle']}; memory "
          + (f"{mem['before_bytes'] / 2**20:.0f} -> {mem['after_bytes'] / 2**20:.0f} MiB" if mem["ratio"]
             else "not measured (the application is not on this machine)"))
    for d in result["disconnects"]:
        print(f"  vanished {d['door']:>4} client, {d['lane']:>8} lane: freed in "
              f"{'%.0f ms' % (d['freed_s'] * 1e3) if d.get('freed_s') is not None else d.get('error', 'never')}")
    for f in result["faults"]:
        print(f"  killed {f['kill']} ({f['lane']} lane): " + (f["error"] if "error" in f else
              f"{f['in_flight_at_kill']} in flight, ended {f['their_ends']}, last error {f['latest_error_s']} s after "
              f"the kill; served again after {f['served_again_s'] and round(f['served_again_s'], 1)} s "
              f"(refusals meanwhile {f['refusals_meanwhile']})"))
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    for p in led["problems"][:20]:
        print(f"  problem: {p}")
    for f in failures[:10]:
        print(f"  client failure: {f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
