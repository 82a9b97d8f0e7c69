"""Throwaway probe (2026-11-29): how close can a WebSocket front door get to the fast lane's
first-token limit if it lives in the ring head's own process, inside the head's loop?

The limit ``fastmode bench gateway`` holds the warm WebSocket against: the loopback round trip
(a TCP echo) plus the ring's first token through its blocking client. The served path today
crosses a separate front door process (client -> gateway -> head -> gateway -> client). This
probe builds the fast lane's ring as the bench does (``bench.lanes_quick.fast_ring``), then, in
the head chip's actor (``__ray_call__``), puts a minimal WebSocket door into the head's own
select loop: websockets' sans-I/O ``ServerProtocol`` for the framing, the ring's tokenizer, one
``add`` per ``response.create``, and ``response.created`` + the first delta written in one send
when the head flushes the first token. The client is ``bench.gateway.ws_response``, the same
one the suite's warm WebSocket figure uses. Blocks of the door and of the limit alternate.

Not product code: no auth, no TLS, no errors beyond the probe's needs, raw ``encode`` of the
input (as the limit's prompt), one-token detokenizing.

Usage: python bench/results/head_door_2026_11_29/probe.py [--rounds 6] [--per-block 20] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def install_door(worker) -> int:
    """Runs in the head chip's actor: a listening socket whose connections the head's loop serves
    as WebSocket clients. Answers the port."""
    import json as _json
    import socket

    from tokenizers import Tokenizer
    from websockets.frames import Opcode
    from websockets.http11 import Request
    from websockets.server import ServerProtocol

    from models import FAST
    from sharding.sampling import SamplingParams
    from sharding.transport import LinkClosed

    head = worker.head
    tok = Tokenizer.from_file(str(FAST / "tokenizer.json"))
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.setblocking(False)

    class WsLink:
        """A WebSocket connection with the interface the head's loop gives a client ``Link``."""

        def __init__(self, sock):
            self.sock = sock
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.proto = ServerProtocol()
            self.queue: list[tuple] = []
            self.fresh: set[str] = set()

        def _write(self):
            data = b"".join(self.proto.data_to_send())
            if data:
                self.sock.setblocking(True)  # the probe's frames are small: a blocking send is fine
                self.sock.sendall(data)
                self.sock.setblocking(False)

        def recv(self):
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return ("noop",), []
            if not data:
                raise LinkClosed("closed")
            self.proto.receive_data(data)
            for event in self.proto.events_received():
                if isinstance(event, Request):
                    self.proto.send_response(self.proto.accept(event))
                elif event.opcode is Opcode.TEXT:
                    req = _json.loads(event.data)
                    params = SamplingParams(temperature=float(req.get("temperature", 1.0)),
                                            max_tokens=int(req["max_output_tokens"]),
                                            ignore_eos=bool(req.get("ignore_eos", False)))
                    self.queue.append(("add", req["id"], tok.encode(req["input"]).ids, params))
                    self.fresh.add(req["id"])
                elif event.opcode is Opcode.CLOSE:
                    self._write()
                    raise LinkClosed("close frame")
            self._write()
            return (self.queue.pop(0) if self.queue else ("noop",)), []

        def read_messages(self):  # what ``Head`` reads of a client since the door's hook (commit after 466a144)
            return [self.recv()[0]]

        def send(self, msg):
            if msg[0] == "out":
                for rid, token, finished, reason, _cached in msg[1]:
                    if rid in self.fresh:
                        self.fresh.discard(rid)
                        self.proto.send_text(_json.dumps({"type": "response.created", "response": {"id": rid}}).encode())
                    self.proto.send_text(_json.dumps({"type": "response.output_text.delta", "response_id": rid,
                                                      "delta": tok.decode([token])}).encode())
                    if finished:
                        self.proto.send_text(_json.dumps({"type": "response.completed",
                                                          "response": {"id": rid, "finish_reason": reason}}).encode())
            elif msg[0] == "error":
                self.proto.send_text(_json.dumps({"type": "error", "error": repr(msg[2])}).encode())
            self._write()

        def close(self):
            self.sock.close()

    original_wait = head._wait

    def _wait(block):
        # ``Head._wait`` with the door's listening socket watched as well.
        watched = [head.server, lsock, *head._hellos, *head.clients]
        if block and head.spin_s > 0:
            from sharding.transport import poll
            if poll(watched, head._flushed + head.spin_s):
                block = False
        if block:
            import select
            select.select(watched, [], [], None)
        ready = original_wait(False)
        import select
        if select.select([lsock], [], [], 0)[0]:
            conn, _ = lsock.accept()
            head.clients[conn] = WsLink(conn)
        return ready

    head._wait = _wait
    return lsock.getsockname()[1]


async def _door_ttft(port: int, n: int) -> list[float]:
    from websockets.asyncio.client import connect

    from bench.gateway import ws_response

    global _conn
    if _conn is None:
        _conn = await connect(f"ws://127.0.0.1:{port}/")
        await ws_response(_conn, "warm", "fastmode-fast", None, 4)
    return [(await ws_response(_conn, f"door-{time.perf_counter_ns()}", "fastmode-fast", None, 4))[0]
            for _ in range(n)]


_conn = None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-block", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()

    import ray
    import uvloop

    from bench.gateway import loopback_rtt_ms
    from bench.lanes_quick import fast_ring
    from bench.load import round_order
    from sharding.sampling import SamplingParams

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    loop = uvloop.new_event_loop()
    with fast_ring(True) as ring:
        m, prompt = ring.model, ring.prompt
        port = ray.get(m.head_worker.__ray_call__.remote(install_door))
        m.generate([prompt], SamplingParams(temperature=0, max_tokens=1))  # the head's loop now watches the door

        def engine(n: int) -> list[float]:
            xs = []
            for _ in range(n):
                t = time.perf_counter()
                m.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
                xs.append(time.perf_counter() - t)
            return xs

        def door(n: int) -> list[float]:
            return loop.run_until_complete(_door_ttft(port, n))

        engine(2)
        door(2)
        out = {"engine": [], "door": []}
        sides = [("door", door), ("engine", engine)]
        for r in range(args.rounds):
            for name, measure in round_order(sides, r):
                out[name].extend(measure(args.per_block))
        rtt_ms = loopback_rtt_ms(40)
        layout = ring.layout
    p50 = {k: statistics.median(v) * 1e3 for k, v in out.items()}
    limit = rtt_ms + p50["engine"]
    print(f"layout {layout}; loopback RTT {rtt_ms:.3f} ms; engine first token p50 {p50['engine']:.3f} ms; "
          f"limit {limit:.3f} ms")
    print(f"door in the head's loop: warm WebSocket first delta p50 {p50['door']:.3f} ms = {p50['door'] / limit:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"date": started, "command": " ".join(sys.argv), "layout": layout,
                                               "loopback_rtt_ms": rtt_ms, "p50_ms": p50, "limit_ms": limit,
                                               "ratio": p50["door"] / limit, "samples_s": out}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
