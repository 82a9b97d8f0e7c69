"""What the front door's WebSocket layer costs a response, with no router, lane or engine behind it.

Starts one server process per uvicorn WebSocket implementation (``--impls``), each serving
``/v1/responses`` with the gateway's own ``serve.websocket.Session`` over a router that answers at once
(``created``, one delta, ``completed``), on uvloop as the gateway's replica runs. One client process
times ``response.create`` -> first delta on a warm connection to each, in alternated blocks
(``--rounds`` of ``--per-block`` requests; the first round warms up). The gateway listens with
uvicorn's ``websockets`` implementation (``serve.listen``; why not ``websockets-sansio``:
docs/front-doors.md).

Usage: python -m bench.ws_layer [--impls websockets-sansio,websockets] [--rounds 6] [--per-block 200]
                                [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fastapi import FastAPI, WebSocket  # at the top: FastAPI resolves the handler's annotations here

from bench.app import free_port
from bench.rounds import round_order


class _Stream:
    def __init__(self, rid: str) -> None:
        self.rid = rid

    def cancel(self) -> None:
        pass

    async def _events(self):
        rid = self.rid
        yield {"type": "created", "id": rid, "lane": "fast", "model": "m", "input_tokens": 1, "route": {"by": "model"}}
        yield {"type": "delta", "id": rid, "seq": 0, "text": "ab", "tokens": 1}
        yield {"type": "done", "id": rid, "finish_reason": "length", "lane": "fast", "model": "m",
               "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}, "timing": {}, "cost_units": 1.0}

    def __aiter__(self):
        return self._events()


class _Router:
    def stream(self, body, history=None, owner: str = "") -> _Stream:
        return _Stream(body["id"])


def serve(port: int, impl: str) -> None:
    import uvicorn

    from serve.config import GatewayConfig
    from serve.websocket import Session

    app = FastAPI()
    config = GatewayConfig(frames_per_s=1e6, frame_burst=10**6)

    @app.websocket("/v1/responses")
    async def responses(ws: WebSocket) -> None:
        await ws.accept()
        await Session(ws, _Router(), config).run()

    uvicorn.run(app, host="127.0.0.1", port=port, ws=impl, ws_per_message_deflate=False, loop="uvloop",
                log_level="warning")


def measure(ports: dict[str, int], rounds: int, per_block: int) -> dict[str, list[float]]:
    from websockets.sync.client import connect

    conns = {}
    for impl, port in ports.items():
        for _ in range(300):  # the server is starting
            try:
                conns[impl] = connect(f"ws://127.0.0.1:{port}/v1/responses", compression=None)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"the {impl} server on port {port} did not start")
    samples: dict[str, list[float]] = {impl: [] for impl in ports}
    n = 0
    try:
        for r in range(rounds):
            for impl in round_order(list(ports), r):
                conn = conns[impl]
                for _ in range(per_block):
                    n += 1
                    t = time.perf_counter()
                    conn.send(json.dumps({"type": "response.create", "id": f"r{n}", "model": "m", "input": "x"}))
                    first = None
                    while (event := json.loads(conn.recv()))["type"] != "response.completed":
                        if event["type"] == "response.output_text.delta" and first is None:
                            first = time.perf_counter() - t
                    if r > 0:  # the first round warms up
                        samples[impl].append(first)
    finally:
        for conn in conns.values():
            conn.close()
    return samples


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="python -m bench.ws_layer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--impls", default="websockets-sansio,websockets")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-block", type=int, default=200)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--serve", nargs=2, metavar=("PORT", "IMPL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return 0
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (the first warms up)")
    ports = {impl: free_port() for impl in args.impls.split(",")}
    servers = [subprocess.Popen([sys.executable, "-m", "bench.ws_layer", "--serve", str(port), impl],
                                cwd=Path(__file__).resolve().parent.parent) for impl, port in ports.items()]
    started = time.strftime("%Y-%m-%d %H:%M")
    try:
        samples = measure(ports, args.rounds, args.per_block)
    finally:
        for s in servers:
            s.terminate()
            s.wait(10)
    p50 = {impl: statistics.median(xs) * 1e3 for impl, xs in samples.items()}
    for impl, ms in p50.items():
        print(f"{impl:<18} response.create -> first delta p50 {ms:.3f} ms ({len(samples[impl])} requests)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(
            {"date": started, "command": "python -m bench.ws_layer " + " ".join(argv), "rounds": args.rounds,
             "per_block": args.per_block, "p50_ms": p50, "samples_s": samples}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
