"""How much of the door's warm first token is its client's, alone: the fast lane's ring in this process
with the lane's layout and options and a door on its head, no application. Blocks alternate of the
ring's own first token through its blocking client (``engine``, the limit's) and the door's warm first
delta through three WebSocket clients, each on its own warm connection: ``websockets``' asyncio client
on the standard event loop (``asyncio``, as ``make bench``'s client runs), the same on uvloop
(``uvloop``), and a blocking client on ``websockets``' sans-I/O ``ClientProtocol`` over a plain socket
(``blocking``: no event loop, no thread).

Usage: python bench/results/door_client_2026_11_29/clients.py [--rounds 6] [--per-block 20] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


class Blocking:
    """A blocking WebSocket client: sans-I/O ``ClientProtocol`` over a socket."""

    def __init__(self, url: str) -> None:
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        uri = parse_uri(url)
        self.sock = socket.create_connection((uri.host, uri.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.proto = ClientProtocol(uri)
        self.proto.send_request(self.proto.connect())
        self._flush()
        self.pending: list = []
        while self.proto.handshake_exc is None and self.proto.state.name == "CONNECTING":
            self.proto.receive_data(self.sock.recv(65536))
            self.proto.events_received()
        if self.proto.handshake_exc is not None:
            raise self.proto.handshake_exc

    def _flush(self) -> None:
        for chunk in self.proto.data_to_send():
            if chunk:
                self.sock.sendall(chunk)

    def send(self, text: str) -> None:
        self.proto.send_text(text.encode())
        self._flush()

    def recv(self) -> str:
        while not self.pending:
            self.proto.receive_data(self.sock.recv(65536))
            self.pending += [e.data.decode() for e in self.proto.events_received()]
            self._flush()
        return self.pending.pop(0)


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

    from bench.gateway import _create, loopback_rtt_ms, ws_response
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
    ray.init(address="local", resources={"chip": tp * pp}, include_dashboard=False, log_to_driver=False)
    try:
        with ShardedModel.from_pretrained(FAST, tp=tp, pp=pp, **ring_options(cfg), door=spec) as m:
            m.warmup()
            url = f"ws://{m.door_address[0]}:{m.door_address[1]}/v1/responses"
            loops = {"asyncio": asyncio.new_event_loop(), "uvloop": uvloop.new_event_loop()}
            conns = {name: loop.run_until_complete(connect(url)) for name, loop in loops.items()}
            blocking = Blocking(url)

            def engine(n: int) -> list[float]:
                xs = []
                for _ in range(n):
                    t = time.perf_counter()
                    m.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
                    xs.append(time.perf_counter() - t)
                return xs

            def on_loop(name: str):
                async def go(n: int) -> list[float]:
                    return [(await ws_response(conns[name], f"d{time.perf_counter_ns()}", "fastmode-fast", None, 4))[0]
                            for _ in range(n)]
                return lambda n: loops[name].run_until_complete(go(n))

            def block(n: int) -> list[float]:
                xs = []
                for _ in range(n):
                    t = time.perf_counter()
                    blocking.send(_create(f"b{time.perf_counter_ns()}", "fastmode-fast", None, 4))
                    first = None
                    while True:
                        e = json.loads(blocking.recv())
                        if e["type"] == "response.output_text.delta" and first is None:
                            first = time.perf_counter() - t
                        elif e["type"] == "response.completed":
                            break
                    xs.append(first)
                return xs

            sides = [("engine", engine), ("asyncio", on_loop("asyncio")), ("uvloop", on_loop("uvloop")),
                     ("blocking", block)]
            for _, f in sides:
                f(2)
            out = {name: [] for name, _ in sides}
            for r in range(args.rounds):
                for name, measure in round_order(sides, r):
                    out[name].extend(measure(args.per_block))
    finally:
        ray.shutdown()
    rtt_ms = loopback_rtt_ms(40)
    p50 = {k: statistics.median(v) * 1e3 for k, v in out.items()}
    limit = rtt_ms + p50["engine"]
    print(f"layout tp={tp} x pp={pp}; loopback RTT {rtt_ms:.3f} ms; engine first token p50 {p50['engine']:.3f} ms; "
          f"limit {limit:.3f} ms; the door's warm first delta p50: " +
          ", ".join(f"{k} {v:.3f} ms ({v / limit:.2f}x)" for k, v in p50.items() if k != "engine"))
    if args.json:
        Path(args.json).write_text(json.dumps({"date": started, "command": " ".join(sys.argv), "loopback_rtt_ms": rtt_ms,
                                               "p50_ms": p50, "limit_ms": limit, "samples_s": out}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
