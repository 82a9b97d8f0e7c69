"""Where a warm WebSocket response's first token waits: client, front door, lane, engine.

Sends ``--trials`` greedy 4-token requests one after another on one persistent WebSocket to a
running app and splits each one's time to first token with the timestamps the stream already
carries: the client's send, ``response.created`` and first delta; the router's ``timing.ttft_s``
(request arrived in the front door -> its first chunk back); the lane's ``timing.engine_ttft_s``
(request arrived in the lane replica -> the engine's first output). The first 3 trials warm up.

    python -m bench.ttft_split --url http://127.0.0.1:8000 --lane fast [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from websockets.asyncio.client import connect

LANES = {"fast": ("fastmode-fast", None), "standard": ("fastmode-full", "default"),
         "priority": ("fastmode-full", "priority")}
WARMUP = 3


async def split(url: str, lane: str, trials: int, key: str | None = None) -> dict:
    """p50 and min (ms) of each part of the time to first token over ``trials`` requests."""
    model, tier = LANES[lane]
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    rows = []
    async with connect(url.replace("http", "ws", 1) + "/v1/responses", additional_headers=headers) as conn:
        for i in range(trials + WARMUP):
            sent = time.perf_counter()
            await conn.send(json.dumps({"type": "response.create", "id": f"split-{i}", "model": model,
                                        "service_tier": tier, "input": "class Parser:\n", "max_output_tokens": 4,
                                        "ignore_eos": True, "temperature": 0}))
            created = first = None
            while True:
                event = json.loads(await conn.recv())
                now = time.perf_counter() - sent
                if event["type"] == "response.created":
                    created = now
                elif event["type"] == "response.output_text.delta" and first is None:
                    first = now
                elif event["type"] == "response.completed":
                    break
                elif event["type"] == "error":
                    raise RuntimeError(event)
            timing = event["timing"]
            rows.append({"client_created": created, "client_first_delta": first,
                         "router_ttft": timing["ttft_s"], "lane_engine_ttft": timing["engine_ttft_s"]})
    rows = rows[WARMUP:]
    out = {"lane": lane, "trials": trials, "url": url}
    for name in rows[0]:
        xs = [1e3 * r[name] for r in rows]
        out[name] = {"p50_ms": statistics.median(xs), "min_ms": min(xs)}
    out["front_door_to_lane_and_back_p50_ms"] = out["router_ttft"]["p50_ms"] - out["lane_engine_ttft"]["p50_ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the app's HTTP URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("--lane", choices=sorted(LANES), default="fast")
    ap.add_argument("--trials", type=int, default=22)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    result = asyncio.run(split(args.url, args.lane, args.trials, args.api_key))
    for name in ("client_created", "client_first_delta", "router_ttft", "lane_engine_ttft"):
        print(f"{name:20s} p50 {result[name]['p50_ms']:7.2f} ms   min {result[name]['min_ms']:7.2f} ms")
    print(f"front door -> lane -> front door, p50: {result['front_door_to_lane_and_back_p50_ms']:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
