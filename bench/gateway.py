"""What the front door costs: per-token overhead of the WebSocket path against the engines called
in process, and time to first token of a warm persistent WebSocket against a fresh HTTP request
and a fresh WebSocket (loopback; the emulated-network variant is part of ``fastmode bench``).

Needs a running application (``fastmode up``); the in-process engines are started here with the
lanes' own configs.

Usage: python -m bench.gateway [--url http://127.0.0.1:8000] [--api-key KEY] [--tokens 256]
                               [--trials 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

import httpx
from websockets.asyncio.client import connect

from bench.lanes_quick import direct

PROMPT = "class Parser:\n"
LANES = {"fast": ("fastmode-fast", None), "standard": ("fastmode-full", "default")}


def _create(rid: str, model: str, tier: str | None, tokens: int) -> str:
    return json.dumps({"type": "response.create", "id": rid, "model": model, "service_tier": tier, "input": PROMPT,
                       "max_output_tokens": tokens, "ignore_eos": True, "temperature": 0})


async def ws_response(conn, rid: str, model: str, tier: str | None, tokens: int,
                      start: float | None = None) -> tuple[float, float, dict]:
    """(seconds to first delta, seconds to completion, the completed event) of one response,
    counted from ``start`` (default: sending the request)."""
    start = time.perf_counter() if start is None else start
    await conn.send(_create(rid, model, tier, tokens))
    first = None
    while True:
        e = json.loads(await conn.recv())
        if e["type"] == "response.output_text.delta" and first is None:
            first = time.perf_counter() - start
        elif e["type"] == "response.completed":
            return first, time.perf_counter() - start, e
        elif e["type"] == "error":
            raise RuntimeError(e)


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


async def measure(url: str, key: str | None, tokens: int, trials: int) -> dict:
    ws_url = url.replace("http", "ws", 1) + "/v1/responses"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    out: dict = {"decode_tokens_per_s": {}, "ttft_ms": {}}
    async with connect(ws_url, additional_headers=headers) as conn:
        for lane, (model, tier) in LANES.items():
            await ws_response(conn, f"warm-{lane}", model, tier, 8)
            rates = []
            for i in range(3):
                first, total, done = await ws_response(conn, f"{lane}-{i}", model, tier, tokens)
                rates.append((done["usage"]["output_tokens"] - 1) / (total - first))
            out["decode_tokens_per_s"][lane] = statistics.median(rates)
        model, tier = LANES["fast"]
        warm = [(await ws_response(conn, f"ttft-{i}", model, tier, 4))[0] for i in range(trials)]
    fresh_ws = []
    for i in range(trials):  # TCP connect + upgrade + request, to the first delta
        start = time.perf_counter()
        async with connect(ws_url, additional_headers=headers) as conn:
            fresh_ws.append((await ws_response(conn, f"fresh-{i}", model, tier, 4, start))[0])
    fresh_http = [await asyncio.to_thread(http_ttft, url, headers, model, tier, 4) for _ in range(trials)]
    for name, xs in (("warm_websocket", warm), ("fresh_http_sse", fresh_http), ("fresh_websocket", fresh_ws)):
        xs = sorted(x * 1e3 for x in xs)
        out["ttft_ms"][name] = {"p50": statistics.median(xs), "p90": xs[int(0.9 * (len(xs) - 1))]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=os.environ.get("FASTMODE_API_KEY"))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    served = asyncio.run(measure(args.url, args.api_key, args.tokens, args.trials))
    engines = direct(args.tokens, 3)
    ref = {"fast": engines["sharded_fast"], "standard": engines["vllm_full"]}
    result = {"tokens": args.tokens, "trials": args.trials, "served": served, "in_process": ref,
              "overhead_ms_per_token": {lane: 1e3 / served["decode_tokens_per_s"][lane] - 1e3 / ref[lane]
                                        for lane in LANES},
              "date": time.strftime("%Y-%m-%d %H:%M"),
              "command": "python -m bench.gateway " + " ".join(sys.argv[1:] if argv is None else argv)}
    for lane in LANES:
        print(f"{lane:<9} in process {ref[lane]:6.0f} tok/s   over the WebSocket "
              f"{served['decode_tokens_per_s'][lane]:6.0f} tok/s   overhead "
              f"{result['overhead_ms_per_token'][lane]:+.2f} ms/token")
    for name, t in served["ttft_ms"].items():
        print(f"time to first token, {name:<22} p50 {t['p50']:6.1f} ms   p90 {t['p90']:6.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
