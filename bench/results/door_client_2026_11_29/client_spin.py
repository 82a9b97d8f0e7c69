"""Which client the limit's engine first token is timed with, alone: the fast lane's ring in this
process with the lane's layout and options and a door on its head, no application. Blocks of the
door's warm first token (``door``: an asyncio WebSocket client, which sleeps in the kernel while it
waits), of the ring's own first token through its blocking client as ``make bench``'s limit takes it
(``engine``: its link polls for ``spin_s`` before it sleeps) and through the same client with
``spin_s`` 0 (``engine_sleeping``) alternate.

Usage: python bench/results/door_client_2026_11_29/client_spin.py [--rounds 6] [--per-block 20] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-block", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()

    import ray
    import uvloop
    from tokenizers import Tokenizer
    from websockets.asyncio.client import connect

    from bench.gateway import loopback_rtt_ms, ws_response
    from bench.lanes_quick import TTFT_PROMPT
    from bench.load import round_order
    from models import FAST
    from serve.config import FastLaneConfig
    from serve.lanes.door import DoorSpec
    from serve.lanes.sharded_engine import resolve_layout, ring_options
    from sharding.pipeline import ShardedModel
    from sharding.sampling import SamplingParams

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cfg = FastLaneConfig()
    tp, pp, _ = resolve_layout(FAST, cfg, os.cpu_count() or 1)
    spec = DoorSpec(model_id="fastmode-fast", model_path=str(FAST), price=1.0, host="127.0.0.1")
    prompt = Tokenizer.from_file(str(FAST / "tokenizer.json")).encode(TTFT_PROMPT).ids
    loop = uvloop.new_event_loop()
    ray.init(address="local", resources={"chip": tp * pp}, include_dashboard=False, log_to_driver=False)
    try:
        with ShardedModel.from_pretrained(FAST, tp=tp, pp=pp, **ring_options(cfg), door=spec) as m:
            m.warmup()
            url = f"ws://{m.door_address[0]}:{m.door_address[1]}/v1/responses"
            conn = loop.run_until_complete(connect(url))

            def engine(n: int) -> list[float]:
                xs = []
                for _ in range(n):
                    t = time.perf_counter()
                    m.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
                    xs.append(time.perf_counter() - t)
                return xs

            async def _door(n: int) -> list[float]:
                return [(await ws_response(conn, f"d{time.perf_counter_ns()}", "fastmode-fast", None, 4))[0]
                        for _ in range(n)]

            def door(n: int) -> list[float]:
                return loop.run_until_complete(_door(n))

            engine(2)
            door(2)
            def engine_sleeping(n: int) -> list[float]:
                m.client.spin_s = 0.0
                try:
                    return engine(n)
                finally:
                    m.client.spin_s = spin

            spin = m.client.spin_s
            out = {"engine": [], "door": [], "engine_sleeping": []}
            for r in range(args.rounds):
                for name, measure in round_order([("door", door), ("engine", engine),
                                                  ("engine_sleeping", engine_sleeping)], r):
                    out[name].extend(measure(args.per_block))
            loop.run_until_complete(conn.close())
    finally:
        ray.shutdown()
    rtt_ms = loopback_rtt_ms(40)
    p50 = {k: statistics.median(v) * 1e3 for k, v in out.items()}
    limit = rtt_ms + p50["engine"]
    print(f"layout tp={tp} x pp={pp}; loopback RTT {rtt_ms:.3f} ms; engine first token p50 {p50['engine']:.3f} ms; "
          f"limit {limit:.3f} ms; the door's warm first delta p50 {p50['door']:.3f} ms = {p50['door'] / limit:.2f}x; "
          f"the engine with a client that sleeps {p50['engine_sleeping']:.3f} ms (spin_s {spin})")
    if args.json:
        Path(args.json).write_text(json.dumps({"date": started, "command": " ".join(sys.argv), "loopback_rtt_ms": rtt_ms,
                                               "p50_ms": p50, "limit_ms": limit, "ratio": p50["door"] / limit, "client_spin_s": spin,
                                               "samples_s": out}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
