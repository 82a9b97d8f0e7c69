"""What the front door costs (``fastmode bench gateway``).

- Per token: single-stream decode speed over the WebSocket against the same engines called in
  process (``bench.in_process.direct``); the difference in ms per token is the serving overhead.
- Throughput ceiling: the standard lane's aggregate tokens/s with ``--concurrency`` streams over
  WebSockets against vLLM in process serving as many requests at once.
- Time to first token on the fast lane (4 tokens): a warm persistent WebSocket, a fresh WebSocket
  (connect + upgrade + request) and a fresh OpenAI SSE request (new TCP connection), on loopback and
  across an emulated network of ``--rtt-ms`` round trip (``bench.netem``: a network namespace and
  veth set up here as root, skipped otherwise), each against the physical limit: one round trip
  (measured: one byte echoed by a TCP server, over loopback or through the emulated network) plus
  the engine's own time to first token in process (the fast lane's ring with the lane's options,
  on the same prompt). Across an emulated network the limit is also given with the engine's first
  token after the ring has been idle one round trip (``physical_limit_engine_idle_ms``): a client
  that sends each request once it has seen the last one end leaves the ring idle that long at
  least, and on a VM a first token after idle costs more than one sent back to back. On loopback the warm WebSocket is measured once more in blocks alternated
  with the engine's own first tokens (``loopback_warm_alternated``): minutes apart, the machine's
  speed drifts by more than the gap being measured. Where the fast lane has a door (``GET /v1/door``,
  ``serve.lanes.door``: its head chip serves the WebSocket itself), a warm WebSocket on it is another
  side of the same rounds (``door_warm_websocket``, ``door_ratio``). In those rounds the served
  first tokens are timed by a blocking client (``bench.ws_blocking``), as the engine's own are
  (its ring's blocking link); the same connections timed by ``websockets``' asyncio client, which
  adds its event loop's time, are two more sides (``asyncio_client``).

Needs a running application (``fastmode up``); the in-process engines are started here with the
lanes' own configs.

Usage: fastmode bench gateway [--url http://127.0.0.1:8000] [--api-key KEY] [--tokens 256]
                              [--trials 20] [--concurrency 32] [--rtt-ms 20] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from tqdm import tqdm
from websockets.asyncio.client import connect

from bench.in_process import TTFT_PROMPT, TTFT_ROUNDS, direct
from bench.ws_blocking import BlockingWebSocket
from bench.rounds import median_interval

REPO = Path(__file__).resolve().parents[1]

PROMPT = TTFT_PROMPT
LANES = {"fast": ("fastmode-fast", None), "standard": ("fastmode-full", "default")}
DECODE_ROUNDS = 9
"""The standard lane's single stream over the WebSocket alternates with vLLM's in process this many
times (about 3 s a round on a 2-core VM; ``single_stream_alternated``). Taken minutes apart (the
served figure at the stage's start, the in-process one later), the two drift apart: one ``make bench``
read 0.81x that way where alternated runs read 1.01-1.07x."""
CEILING_ROUNDS = 9
"""The throughput ceiling alternates the served lane and the engine in process this many times (about
8 s a round on a 2-core VM). One round's ratio moves by 0.8-0.97x between rounds there; with 9 the
median gets a 96% interval from the rounds themselves (``median_interval``: the 2nd and 8th of the
sorted ratios), where 3 rounds give none."""


def _create(rid: str, model: str, tier: str | None, tokens: int) -> str:
    return json.dumps({"type": "response.create", "id": rid, "model": model, "service_tier": tier, "input": PROMPT,
                       "max_output_tokens": tokens, "ignore_eos": True, "temperature": 0})


async def ws_response(conn, rid: str, model: str, tier: str | None, tokens: int,
                      start: float | None = None) -> tuple[float, float, dict]:
    """(seconds to first delta, seconds to completion, the completed event) of one response,
    counted from ``start`` (default: sending the request)."""
    start = time.perf_counter() if start is None else start
    await conn.send(_create(rid, model, tier, tokens))
    first, done = None, None
    while done is None:
        first, done = _timed_event(await conn.recv(), start, first)
    return first, time.perf_counter() - start, done


def _timed_event(text: str, start: float, first: float | None) -> tuple[float | None, dict | None]:
    """One event of a response being timed from ``start``: (seconds to its first delta, so far; the
    ``response.completed`` event, once it came); ``RuntimeError`` on an ``error`` event."""
    e = json.loads(text)
    if e["type"] == "response.output_text.delta" and first is None:
        first = time.perf_counter() - start
    elif e["type"] == "error":
        raise RuntimeError(e)
    return first, e if e["type"] == "response.completed" else None


def blocking_response(conn: BlockingWebSocket, rid: str, model: str, tier: str | None,
                      tokens: int) -> tuple[float, float, dict]:
    """``ws_response`` on a blocking client (``bench.ws_blocking``)."""
    start = time.perf_counter()
    conn.send(_create(rid, model, tier, tokens))
    first, done = None, None
    while done is None:
        first, done = _timed_event(conn.recv(), start, first)
    return first, time.perf_counter() - start, done


def http_ttft(url: str, headers: dict, model: str, tier: str | None, tokens: int) -> float:
    """Seconds to the first text of an OpenAI chat completion streamed over SSE, on a fresh
    connection (a new TCP connection each time, as a client without keep-alive makes)."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
            "temperature": 0, "stream": True}
    if tier:
        body["service_tier"] = tier
    start = time.perf_counter()
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client, \
            client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    return time.perf_counter() - start
    raise RuntimeError("no text")


def door_url(url: str, key: str | None) -> str | None:
    """The fast lane's door (``GET /v1/door``: ``serve.lanes.door``) of the gateway at ``url``, or
    ``None`` if it has none."""
    r = httpx.get(url + "/v1/door", headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=30)
    return r.json()["data"][0]["url"] if r.status_code == 200 else None


async def warm_ttft(url: str, key: str | None, trials: int, door: bool = False) -> list[float]:
    """``trials`` times to first token (seconds) on the fast lane, 4 tokens each, one after another on
    one warm persistent WebSocket (after one request that is not counted): the gateway's, or with
    ``door`` the fast lane's own (``door_url``)."""
    ws_url, headers = _responses_ws(url, key)
    if door:
        ws_url = door_url(url, key)
    model, tier = LANES["fast"]
    async with connect(ws_url, additional_headers=headers) as conn:
        await ws_response(conn, "warm", model, tier, 4)
        return [(await ws_response(conn, f"ttft-{i}", model, tier, 4))[0] for i in range(trials)]


def warm_ttft_blocking(url: str, key: str | None, trials: int, door: bool = False) -> list[float]:
    """``warm_ttft`` timed by a blocking client (``bench.ws_blocking``) instead of the asyncio one."""
    ws_url, headers = _responses_ws(url, key)
    if door:
        ws_url = door_url(url, key)
    model, tier = LANES["fast"]
    with BlockingWebSocket(ws_url, headers) as conn:
        blocking_response(conn, "warm", model, tier, 4)
        return [blocking_response(conn, f"ttft-{i}", model, tier, 4)[0] for i in range(trials)]


async def ttft(url: str, key: str | None, trials: int) -> dict:
    """Time to first token (ms, p50/p90) on the fast lane, 4 tokens: a warm persistent WebSocket,
    a fresh WebSocket (TCP connect + upgrade + request) and a fresh OpenAI SSE request; and
    ``health_round_trip``, a GET /health on a warm keep-alive connection, which shows the round
    trip the path really has."""
    ws_url, headers = _responses_ws(url, key)
    model, tier = LANES["fast"]
    warm = await warm_ttft(url, key, trials)
    fresh_ws = []
    for i in range(trials):
        start = time.perf_counter()
        async with connect(ws_url, additional_headers=headers) as conn:
            fresh_ws.append((await ws_response(conn, f"fresh-{i}", model, tier, 4, start))[0])
    fresh_http = [await asyncio.to_thread(http_ttft, url, headers, model, tier, 4) for _ in range(trials)]
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:  # the path's own round trip
        await http.get("/health")
        probe = []
        for _ in range(trials):
            t = time.perf_counter()
            (await http.get("/health")).raise_for_status()
            probe.append(time.perf_counter() - t)
    out = {}
    for name, xs in (("warm_websocket", warm), ("fresh_websocket", fresh_ws), ("fresh_http_sse", fresh_http),
                     ("health_round_trip", probe)):
        xs = sorted(x * 1e3 for x in xs)
        out[name] = {"p50": statistics.median(xs), "p90": xs[int(0.9 * (len(xs) - 1))]}
    return out


def _responses_ws(url: str, key: str | None) -> tuple[str, dict]:
    """The WebSocket address of ``/v1/responses`` on the gateway at ``url``, and its auth headers."""
    return url.replace("http", "ws", 1) + "/v1/responses", {"Authorization": f"Bearer {key}"} if key else {}


async def decode(url: str, key: str | None, tokens: int) -> dict:
    """Single-stream decode tokens/s per lane over one WebSocket (median of 3)."""
    ws_url, headers = _responses_ws(url, key)
    out: dict = {"decode_tokens_per_s": {}}
    async with connect(ws_url, additional_headers=headers, max_queue=None) as conn:
        for lane, (model, tier) in LANES.items():
            await ws_response(conn, f"warm-{lane}", model, tier, 8)
            rates = [await _decode_rate(conn, f"{lane}-{i}", model, tier, tokens) for i in range(3)]
            out["decode_tokens_per_s"][lane] = statistics.median(rates)
    return out


async def _decode_rate(conn, rid: str, model: str, tier: str | None, tokens: int) -> float:
    """One response's decode tokens/s: the output tokens after the first over the time after the first."""
    first, total, done = await ws_response(conn, rid, model, tier, tokens)
    return (done["usage"]["output_tokens"] - 1) / (total - first)


async def standard_decode(url: str, key: str | None, tokens: int) -> float:
    """One standard-lane stream's decode tokens/s over a warm WebSocket (after an 8-token request), as
    ``decode`` takes it: the output tokens after the first over the time after the first."""
    ws_url, headers = _responses_ws(url, key)
    model, tier = LANES["standard"]
    async with connect(ws_url, additional_headers=headers, max_queue=None) as conn:
        await ws_response(conn, "warm", model, tier, 8)
        return await _decode_rate(conn, "decode", model, tier, tokens)


async def ws_aggregate(url: str, key: str | None, tokens: int, concurrency: int,
                       connects: list[float] | None = None) -> float:
    """The standard lane's aggregate tokens/s with ``concurrency`` streams at once, one WebSocket each
    (``ws_response`` reads its own connection's events), counted from the requests' sending: the
    connections are opened first, as a client of the persistent WebSocket holds them (the engine in
    process is likewise built before its timer starts). The seconds the ``concurrency`` handshakes
    took together are appended to ``connects``."""
    ws_url, headers = _responses_ws(url, key)
    model, tier = LANES["standard"]
    start = time.perf_counter()
    conns = await asyncio.gather(*(connect(ws_url, additional_headers=headers) for _ in range(concurrency)))
    if connects is not None:
        connects.append(time.perf_counter() - start)
    try:
        start = time.perf_counter()
        done = await asyncio.gather(*(ws_response(c, f"agg-{i}", model, tier, tokens) for i, c in enumerate(conns)))
        return sum(d[2]["usage"]["output_tokens"] for d in done) / (time.perf_counter() - start)
    finally:
        await asyncio.gather(*(c.close() for c in conns))


def client_trio(url: str, key: str | None, trials: int, prefix: list[str] = (), warm_only: bool = False,
                door: bool = False, client: str = "asyncio"):
    """The TTFT trio measured by this module run with ``--ttft-only`` in a fresh process (behind
    ``prefix``: inside the client namespace), so loopback and emulated figures come from the same
    client in the same conditions. ``warm_only``: the warm WebSocket's samples only (seconds); with
    ``door``, the fast lane's door's; ``client``: ``asyncio`` or ``blocking`` (``--client``)."""
    cmd = [*prefix, sys.executable, "-m", "bench.gateway", "--ttft-only", "--trials", str(trials), "--url", url,
           *(["--warm-only", "--client", client] if warm_only else []), *(["--door"] if door else [])]
    env = dict(os.environ, FASTMODE_API_KEY=key or "")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"the time-to-first-token client failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def emulated(url: str, key: str | None, trials: int, rtt_ms: float) -> dict:
    """The TTFT trio across an emulated network (``bench.netem``), the client in its namespace, and
    the network's own round trip as that client sees it (``measured_rtt_ms``)."""
    from urllib.parse import urlparse

    from bench.netem import emulated_network

    port = urlparse(url).port or 80
    with emulated_network(port, rtt_ms) as net:
        trio = client_trio(f"http://{net.host}:{net.port}", key, trials, net.client_prefix)
    return {"rtt_ms": rtt_ms, "method": net.method, "ttft_ms": trio, "measured_rtt_ms": network_rtt_ms(rtt_ms, trials)}


ECHO_CLIENT = """
import socket, statistics, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s.sendall(b"w"); s.recv(1)
xs = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); s.sendall(b"x"); s.recv(1); xs.append(time.perf_counter() - t)
print(statistics.median(xs) * 1e3)
"""


@contextlib.contextmanager
def _echo_server():
    """A TCP server on loopback that echoes every byte back; yields its port."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while data := conn.recv(64):
                    conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def _echo_rtt(prefix: list[str], host: str, port: int, trials: int) -> float:
    r = subprocess.run([*prefix, sys.executable, "-c", ECHO_CLIENT, host, str(port), str(trials)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"the echo client failed: {r.stderr[-1000:]}")
    return float(r.stdout)


def network_rtt_ms(rtt_ms: float, trials: int) -> float:
    """The emulated network's round trip (ms, p50) as a Python client in its namespace sees it: one byte
    to a TCP echo server on this side and back, through the same kind of path (veth, and the delay relay
    where netem is missing, whose own processing is part of the network)."""
    from bench.netem import emulated_network

    with _echo_server() as port, emulated_network(port, rtt_ms) as net:
        return _echo_rtt(net.client_prefix, net.host, net.port, trials)


def loopback_rtt_ms(trials: int) -> float:
    """Loopback's round trip (ms, p50), measured as ``network_rtt_ms`` measures an emulated network's:
    one byte from a Python client process to a TCP echo server in this one, and back."""
    with _echo_server() as port:
        return _echo_rtt([], "127.0.0.1", port, trials)


def served_ttft_sides(url: str, key: str | None, door: bool) -> dict:
    """The served sides of the loopback rounds (``direct(served_ttft=...)``): the gateway's warm
    WebSocket and, with ``door``, the fast lane's door, each timed by the blocking client
    (``gateway``, ``door``) and by ``websockets``' asyncio client (``gateway_asyncio``,
    ``door_asyncio``)."""
    sides = {"gateway": lambda n: client_trio(url, key, n, warm_only=True, client="blocking")}
    if door:
        sides["door"] = lambda n: client_trio(url, key, n, warm_only=True, door=True, client="blocking")
        sides["door_asyncio"] = lambda n: client_trio(url, key, n, warm_only=True, door=True)
    sides["gateway_asyncio"] = lambda n: client_trio(url, key, n, warm_only=True)
    return sides


def alternated_ttft(samples_s: dict[str, list[float]], engine_ttft_ms: float, loop_rtt_ms: float) -> dict:
    """``loopback_warm_alternated``: each served side's p50 and p90 (ms) and its ratio to the physical
    limit (the loopback round trip plus the engine's own first token, the median of its blocks)."""
    def stats(xs: list[float]) -> dict:
        ms = sorted(1e3 * x for x in xs)
        return {"p50": statistics.median(ms), "p90": ms[int(0.9 * (len(ms) - 1))]}

    limit = loop_rtt_ms + engine_ttft_ms
    out = {"rounds": TTFT_ROUNDS, "samples_per_side": len(samples_s["gateway"]), "engine_ttft_ms": engine_ttft_ms,
           "physical_limit_ms": limit, "client": "blocking (bench.ws_blocking), as the engine's own",
           "warm_websocket": stats(samples_s["gateway"])}
    out["ratio"] = out["warm_websocket"]["p50"] / limit
    if "door" in samples_s:  # the fast lane's door
        out["door_warm_websocket"] = stats(samples_s["door"])
        out["door_ratio"] = out["door_warm_websocket"]["p50"] / limit
    out["asyncio_client"] = {}  # the same connections timed by websockets' asyncio client
    for side, prefix in (("gateway_asyncio", ""), ("door_asyncio", "door_")):
        if side in samples_s:
            out["asyncio_client"][prefix + "warm_websocket"] = p = stats(samples_s[side])
            out["asyncio_client"][prefix + "ratio"] = p["p50"] / limit
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="fastmode bench gateway", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=os.environ.get("FASTMODE_API_KEY"))
    ap.add_argument("--tokens", type=int, default=256, help="tokens per decode-speed request")
    ap.add_argument("--trials", type=int, default=20, help="time-to-first-token trials per kind")
    ap.add_argument("--concurrency", type=int, default=32, help="streams for the throughput ceiling (0: skip)")
    ap.add_argument("--rtt-ms", default="20", help="emulated round trips, comma-separated (empty: skip)")
    ap.add_argument("--quick", action="store_true", help="32 tokens, 3 trials, 4 streams, the fast "
                    "model in process eager (a smoke run: its figures mean nothing)")
    ap.add_argument("--ttft-only", action="store_true", help="print the TTFT trio as JSON (the client side "
                    "of the emulated network)")
    ap.add_argument("--warm-only", action="store_true", help="with --ttft-only: the warm WebSocket's "
                    "samples only, in seconds (the blocks alternated with the engine's own first tokens)")
    ap.add_argument("--door", action="store_true", help="with --warm-only: on the fast lane's door "
                    "(GET /v1/door) instead of the gateway's WebSocket")
    ap.add_argument("--client", choices=["asyncio", "blocking"], default="asyncio", help="with --warm-only: "
                    "websockets' asyncio client, or a blocking one (bench.ws_blocking)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.ttft_only:
        if args.warm_only and args.client == "blocking":
            print(json.dumps(warm_ttft_blocking(args.url, args.api_key or None, args.trials, door=args.door)))
        elif args.warm_only:
            print(json.dumps(asyncio.run(warm_ttft(args.url, args.api_key or None, args.trials, door=args.door))))
        else:
            print(json.dumps(asyncio.run(ttft(args.url, args.api_key or None, args.trials))))
        return 0
    if args.quick:
        args.tokens, args.trials, args.concurrency = 32, 3, 4
    rtts = [float(x) for x in args.rtt_ms.split(",") if x.strip()]
    started = time.strftime("%Y-%m-%d %H:%M")
    steps = ["decode over the WebSocket", "time to first token, loopback"] + \
            [f"time to first token, {r:g} ms round trip" for r in rtts] + ["engines in process (and the ceiling)"]
    bar = tqdm(total=len(steps), desc="gateway", unit="step", file=sys.stderr)
    bar.set_description(steps[0])
    served = asyncio.run(decode(args.url, args.api_key, args.tokens))
    bar.update()
    bar.set_description(steps[1])
    served["ttft_ms"] = client_trio(args.url, args.api_key, args.trials)
    loop_rtt_ms = loopback_rtt_ms(max(args.trials, 20))
    bar.update()
    networks, skipped = [], None
    for rtt, step in zip(rtts, steps[2:], strict=False):
        bar.set_description(step)
        try:
            networks.append(emulated(args.url, args.api_key, args.trials, rtt))
        except PermissionError as e:
            skipped = str(e)
            print(f"emulated network: {skipped}", file=sys.stderr)
            break
        finally:
            bar.update()
    bar.set_description(steps[-1])
    has_door = door_url(args.url, args.api_key) is not None
    connects: list[float] = []
    engines = direct(args.tokens, DECODE_ROUNDS if not args.quick else 3, args.concurrency,
                     rounds=CEILING_ROUNDS if not args.quick else 1,
                     served_decode=lambda: standard_decode(args.url, args.api_key, args.tokens),
                     compile=not args.quick,
                     served_aggregate=lambda: ws_aggregate(args.url, args.api_key, args.tokens, args.concurrency,
                                                                  connects),
                     served_ttft=served_ttft_sides(args.url, args.api_key, has_door),
                     idle_s=[net["rtt_ms"] / 1e3 for net in networks])
    bar.update()
    bar.close()
    ref = {"fast": engines["sharded_fast"], "standard": engines["vllm_full"]}
    engine_ttft_ms = 1e3 * engines["sharded_fast_ttft_s"]
    alternated = alternated_ttft(engines["served_ttft_samples_s"], engine_ttft_ms, loop_rtt_ms)
    for net in networks:  # one round trip (as measured through the emulated network) plus the engine's own TTFT
        net["physical_limit_ms"] = net["measured_rtt_ms"] + engine_ttft_ms
        net["physical_limit_nominal_rtt_ms"] = net["rtt_ms"] + engine_ttft_ms
        # A client that waits for each response before the next leaves the ring idle one round trip at least.
        idle = engines.get("sharded_fast_ttft_after_idle_s", {}).get(str(net["rtt_ms"] / 1e3))
        if idle is not None:
            net["engine_ttft_after_idle_ms"] = 1e3 * idle
            net["physical_limit_engine_idle_ms"] = net["measured_rtt_ms"] + 1e3 * idle
    result = {"date": started, "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
              "command": "fastmode bench gateway " + shlex.join(argv),
              "tokens": args.tokens, "trials": args.trials, "served": served, "in_process": engines,
              "overhead_ms_per_token": {lane: 1e3 / served["decode_tokens_per_s"][lane] - 1e3 / ref[lane]
                                        for lane in LANES},
              "engine_ttft_ms": engine_ttft_ms, "loopback_rtt_ms": loop_rtt_ms,
              "loopback_physical_limit_ms": loop_rtt_ms + engine_ttft_ms, "loopback_warm_alternated": alternated,
              "emulated_network": networks,
              "emulated_network_skipped": skipped}
    single = list(zip(engines["served_decodes"], engines["vllm_full_decodes"], strict=True))
    result["single_stream_alternated"] = {  # the standard lane, one stream, alternated with vLLM in process
        "rounds": len(single), "websocket_tokens_per_s": [a for a, _ in single],
        "in_process_tokens_per_s": [b for _, b in single], "ratios": [a / b for a, b in single],
        "ratio": statistics.median(a / b for a, b in single), "ratio_interval": median_interval([a / b for a, b in single])}
    if args.concurrency:
        pairs = list(zip(engines["served_aggregates"], engines["vllm_full_aggregates"], strict=True))
        result["throughput_ceiling"] = {
            "concurrency": args.concurrency, "rounds": len(pairs),
            "websocket_aggregate_tokens_per_s": statistics.median(a for a, _ in pairs),
            "in_process_aggregate_tokens_per_s": statistics.median(b for _, b in pairs),
            "ratios": [a / b for a, b in pairs], "ratio": statistics.median(a / b for a, b in pairs),
            "ratio_interval": median_interval([a / b for a, b in pairs]),
            # each round's handshakes, outside its window (a fresh client pays them once per connection)
            "connect_ms": {"median": 1e3 * statistics.median(connects), "max": 1e3 * max(connects)}}
    for lane in LANES:
        print(f"{lane:<9} in process {ref[lane]:6.0f} tok/s   over the WebSocket "
              f"{served['decode_tokens_per_s'][lane]:6.0f} tok/s   overhead "
              f"{result['overhead_ms_per_token'][lane]:+.2f} ms/token")
    one = result["single_stream_alternated"]
    print(f"standard, 1 stream, {one['rounds']} rounds alternated with vLLM in process: over the WebSocket "
          f"{statistics.median(one['websocket_tokens_per_s']):.0f} tok/s, in process "
          f"{statistics.median(one['in_process_tokens_per_s']):.0f} tok/s ({one['ratio']:.2f}x"
          + (", 95% interval [{:.2f}, {:.2f}])".format(*one["ratio_interval"]) if one["ratio_interval"] else ")"))
    if args.concurrency:
        c = result["throughput_ceiling"]
        print(f"standard, {c['concurrency']} streams: over the WebSocket {c['websocket_aggregate_tokens_per_s']:.0f} "
              f"tok/s, in process {c['in_process_aggregate_tokens_per_s']:.0f} tok/s ({c['ratio']:.2f}x"
              + (", 95% interval [{:.2f}, {:.2f}])".format(*c["ratio_interval"]) if c["ratio_interval"] else ")")
              + f"; the {c['concurrency']} connections opened beforehand in {c['connect_ms']['median']:.0f} ms")
    for label, trio, limit in [("loopback", served["ttft_ms"], result["loopback_physical_limit_ms"])] + \
            [(f"{n['rtt_ms']:g} ms RTT", n["ttft_ms"], n["physical_limit_ms"]) for n in networks]:
        print(f"time to first token, {label} (physical limit {limit:.1f} ms): " + ", ".join(
            f"{name} p50 {t['p50']:.1f} ms" for name, t in trio.items()))
    print(f"warm WebSocket first token on loopback (a blocking client, as the engine's), {TTFT_ROUNDS} blocks "
          "alternated with the engine's own: "
          f"p50 {alternated['warm_websocket']['p50']:.2f} ms against {alternated['physical_limit_ms']:.2f} ms "
          f"({alternated['ratio']:.2f}x)")
    if "door_ratio" in alternated:
        print(f"  the fast lane's door (GET /v1/door), in the same rounds: p50 "
              f"{alternated['door_warm_websocket']['p50']:.2f} ms ({alternated['door_ratio']:.2f}x)")
    for key, what in (("", "the gateway"), ("door_", "the door")):
        if key + "ratio" in alternated["asyncio_client"]:
            print(f"  {what} timed by websockets' asyncio client, in the same rounds: p50 "
                  f"{alternated['asyncio_client'][key + 'warm_websocket']['p50']:.2f} ms "
                  f"({alternated['asyncio_client'][key + 'ratio']:.2f}x)")
    for n in networks:
        print(f"  {n['rtt_ms']:g} ms RTT emulated by: {n['method']}")
        if "physical_limit_engine_idle_ms" in n:
            print(f"  {n['rtt_ms']:g} ms RTT, the engine's first token after {n['rtt_ms']:g} ms idle: "
                  f"{n['engine_ttft_after_idle_ms']:.2f} ms; physical limit with it "
                  f"{n['physical_limit_engine_idle_ms']:.1f} ms (warm WebSocket "
                  f"{n['ttft_ms']['warm_websocket']['p50'] / n['physical_limit_engine_idle_ms']:.2f}x)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
