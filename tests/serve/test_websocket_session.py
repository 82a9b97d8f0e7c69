"""``serve.websocket.Session`` with a scripted socket and router: multiplexing, bad input,
backpressure, idle timeout and maximum age, without starting Ray."""

from __future__ import annotations

import asyncio
import json
import time

from serve.config import GatewayConfig
from serve.websocket import CLOSE_GOING_AWAY, CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TOO_BIG, FrameBudget, Session


class FakeSocket:
    """Frames in from a queue; frames out to a list (optionally slow to write)."""

    def __init__(self, send_delay_s: float = 0.0) -> None:
        self.incoming: asyncio.Queue = asyncio.Queue()
        self.sent: list[dict] = []
        self.closed: int | None = None
        self.send_delay_s = send_delay_s

    def client_sends(self, event) -> None:
        self.incoming.put_nowait({"type": "websocket.receive", "text": event if isinstance(event, str)
                                  else json.dumps(event)})

    def client_leaves(self) -> None:
        self.incoming.put_nowait({"type": "websocket.disconnect", "code": 1000})

    async def receive(self) -> dict:
        return await self.incoming.get()

    async def send_text(self, text: str) -> None:
        if self.send_delay_s:
            await asyncio.sleep(self.send_delay_s)
        self.sent.append(json.loads(text))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed, self.reason = code, reason
        self.client_leaves()  # a client answers the close

    def of(self, rid: str) -> list[dict]:
        return [e for e in self.sent if e.get("id") == rid]


class FakeStream:
    def __init__(self, events: list[dict], every_s: float, log: list) -> None:
        self.events, self.every_s, self.log = events, every_s, log

    def cancel(self) -> None:
        self.log.append("cancelled")

    async def _gen(self):
        for e in self.events:
            await asyncio.sleep(self.every_s)
            yield dict(e)
        self.log.append("finished")

    def __aiter__(self):
        return self._gen()


class FakeRouter:
    """``generate`` streams created, ``n`` deltas of ``text`` each, done (or the body's error)."""

    def __init__(self, n: int = 5, text: str = "ab", every_s: float = 0.0) -> None:
        self.n, self.text, self.every_s = n, text, every_s
        self.logs: dict[str, list] = {}

    def stream(self, body: dict, history=None, owner: str = "") -> FakeStream:
        assert history is not None  # the connection's own kept responses (serve.conversation)
        rid = body["id"]
        if body.get("model") == "nope":
            events = [{"type": "error", "id": rid, "code": "unknown_model", "message": "no", "status": 404}]
        else:
            events = ([{"type": "created", "id": rid, "lane": "fast", "model": "m", "input_tokens": 1,
                        "route": {"by": "model"}}]
                      + [{"type": "delta", "id": rid, "seq": i, "text": self.text, "tokens": 1} for i in range(self.n)]
                      + [{"type": "done", "id": rid, "finish_reason": "length", "lane": "fast", "model": "m",
                          "usage": {"input_tokens": 1, "output_tokens": self.n, "total_tokens": self.n + 1},
                          "timing": {}, "cost_units": 0.0}])
        self.logs[rid] = []
        return FakeStream(events, self.every_s, self.logs[rid])


def run_session(ws: FakeSocket, router: FakeRouter, script, **config) -> None:
    async def main():
        session = Session(ws, router, GatewayConfig(**config))
        task = asyncio.create_task(session.run())
        await script(ws)
        await asyncio.wait_for(task, 10)

    asyncio.run(main())


async def until(cond, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_many_responses_multiplex_on_one_connection():
    ws, router = FakeSocket(), FakeRouter(n=5, every_s=0.001)

    async def script(ws):
        for i in range(10):
            ws.client_sends({"type": "response.create", "id": f"r{i}", "model": "m", "input": "x"})
        await until(lambda: sum(e["type"] == "response.completed" for e in ws.sent) == 10)
        ws.client_leaves()

    run_session(ws, router, script)
    for i in range(10):
        events = ws.of(f"r{i}")
        assert [e["type"] for e in events] == (["response.created"] + ["response.output_text.delta"] * 5
                                               + ["response.completed"])
        assert [e["seq"] for e in events[1:-1]] == list(range(5))


def test_bad_input_gets_error_events_and_the_connection_lives_on():
    ws, router = FakeSocket(), FakeRouter(n=1)

    async def script(ws):
        ws.client_sends("{not json")
        ws.incoming.put_nowait({"type": "websocket.receive", "bytes": b"\x00\x01"})
        ws.client_sends([1, 2])
        ws.client_sends({"type": "response.explode", "id": "a"})
        ws.client_sends({"type": "response.create", "model": "m", "input": "x"})
        ws.client_sends({"type": "response.cancel", "id": "ghost"})
        ws.client_sends({"type": "response.create", "id": "bad", "model": "nope", "input": "x"})
        ws.client_sends({"type": "response.create", "id": "ok", "model": "m", "input": "x"})
        await until(lambda: any(e["type"] == "response.completed" for e in ws.sent))
        ws.client_leaves()

    run_session(ws, router, script)
    codes = [e["code"] for e in ws.sent if e["type"] == "error"]
    assert codes == ["invalid_json", "binary_frame", "invalid_event", "unknown_event", "invalid_request",
                     "unknown_id", "unknown_model"]
    assert ws.of("ok")[-1]["type"] == "response.completed"


def test_duplicate_in_flight_id_and_cancel():
    ws, router = FakeSocket(), FakeRouter(n=1000, every_s=0.005)

    async def script(ws):
        ws.client_sends({"type": "response.create", "id": "a", "model": "m", "input": "x"})
        await until(lambda: any(e["type"] == "response.output_text.delta" for e in ws.sent))
        ws.client_sends({"type": "response.create", "id": "a", "model": "m", "input": "x"})
        await until(lambda: any(e.get("code") == "duplicate_id" for e in ws.sent))
        ws.client_sends({"type": "response.cancel", "id": "a"})
        await until(lambda: any(e["type"] == "response.cancelled" for e in ws.sent))
        ws.client_leaves()

    run_session(ws, router, script)
    assert router.logs["a"] == ["cancelled"]  # the router stream was cancelled, not finished
    assert ws.of("a")[-1]["type"] == "response.cancelled"


def test_disconnect_cancels_every_response_of_the_connection():
    ws, router = FakeSocket(), FakeRouter(n=1000, every_s=0.005)

    async def script(ws):
        for rid in ("a", "b", "c"):
            ws.client_sends({"type": "response.create", "id": rid, "model": "m", "input": "x"})
        await until(lambda: len({e["id"] for e in ws.sent if e["type"] == "response.output_text.delta"}) == 3)
        ws.client_leaves()

    run_session(ws, router, script)
    assert all(router.logs[r] == ["cancelled"] for r in "abc")
    assert ws.closed is None  # the client left; nothing to close


def test_responses_in_flight_per_connection_are_capped():
    ws, router = FakeSocket(), FakeRouter(n=1000, every_s=0.005)

    async def script(ws):
        for rid in ("a", "b", "c"):
            ws.client_sends({"type": "response.create", "id": rid, "model": "m", "input": "x"})
        await until(lambda: any(e.get("code") == "too_many_in_flight" for e in ws.sent))
        ws.client_sends({"type": "response.cancel", "id": "a"})
        await until(lambda: any(e["type"] == "response.cancelled" for e in ws.sent))
        ws.client_sends({"type": "response.create", "id": "d", "model": "m", "input": "x"})  # room again
        await until(lambda: any(e["type"] == "response.output_text.delta" for e in ws.of("d")))
        ws.client_leaves()

    run_session(ws, router, script, max_in_flight=2)
    assert ws.of("c") == [{"type": "error", "id": "c", "code": "too_many_in_flight",
                           "message": "at most 2 responses in flight per connection"}]


def test_a_client_gone_with_frames_still_buffered_ends_its_session_at_once():
    """Found after the fuzz (its connections still counted against their key long after their clients
    had gone): once a send failed, every frame still buffered for the session waited
    slow_reader_timeout_s for room in the send queue before the session could see the disconnect."""

    class GoneSocket(FakeSocket):
        async def send_text(self, text: str) -> None:
            raise RuntimeError("the client has gone")

    ws, router = GoneSocket(), FakeRouter(n=1000, every_s=0.005)
    ws.client_sends({"type": "response.create", "id": "a", "model": "m", "input": "x"})
    for i in range(600):  # more than the send queue holds
        ws.client_sends({"type": "response.cancel", "id": f"x{i}"})
    ws.client_leaves()

    async def main():
        start = time.monotonic()
        await asyncio.wait_for(Session(ws, router, GatewayConfig()).run(), 10)
        return time.monotonic() - start

    assert asyncio.run(main()) < 1.0
    assert router.logs["a"] == ["cancelled"]  # and its response was cancelled, not left running


def test_a_slow_reader_gets_merged_deltas_and_loses_nothing():
    ws = FakeSocket(send_delay_s=0.1)  # 10 frames/s, far fewer than the stream's deltas
    router = FakeRouter(n=1000, text="0123456789", every_s=0.001)

    async def script(ws):
        ws.client_sends({"type": "response.create", "id": "a", "model": "m", "input": "x"})
        await until(lambda: any(e["type"] == "response.completed" for e in ws.sent), timeout_s=30)
        ws.client_leaves()

    run_session(ws, router, script, send_queue_events=8)
    deltas = [e for e in ws.of("a") if e["type"] == "response.output_text.delta"]
    assert "".join(d["delta"] for d in deltas) == "0123456789" * 1000
    assert len(deltas) < 200 and max(len(d["delta"]) for d in deltas) > 10
    assert [d["seq"] for d in deltas] == list(range(len(deltas)))


def test_a_reader_too_far_behind_is_cancelled_with_slow_consumer_and_memory_stays_bounded():
    ws = FakeSocket(send_delay_s=0.2)
    router = FakeRouter(n=20000, text="x" * 10, every_s=0.0001)
    peak = []

    async def script(ws):
        ws.client_sends({"type": "response.create", "id": "a", "model": "m", "input": "x"})
        await until(lambda: any(e.get("code") == "slow_consumer" for e in ws.sent), timeout_s=20)
        ws.client_leaves()

    async def main():
        session = Session(ws, router, GatewayConfig(send_queue_events=8, max_pending_chars=500))
        task = asyncio.create_task(session.run())
        watch = asyncio.create_task(_watch(session, peak))
        await script(ws)
        await asyncio.wait_for(task, 20)
        watch.cancel()

    asyncio.run(main())
    deltas = [e for e in ws.of("a") if e["type"] == "response.output_text.delta"]
    assert max(peak) <= 8
    assert [d["seq"] for d in deltas] == list(range(len(deltas)))
    assert router.logs["a"] == ["cancelled"]


def test_a_delta_is_written_by_its_responses_own_task_when_nothing_is_queued():
    """``Session._send_now``: with the send loop idle, a delta goes to the socket from the task that
    read it (no loop turn for the send loop); ``created`` and ``completed`` go through the send loop."""
    writers = []

    class Recording(FakeSocket):
        async def send_text(self, text: str) -> None:
            writers.append((json.loads(text)["type"], asyncio.current_task().get_coro().__qualname__))
            await super().send_text(text)

    ws = Recording()

    async def script(ws):
        ws.client_sends({"type": "response.create", "id": "a", "model": "m", "input": "x"})
        await until(lambda: any(e["type"] == "response.completed" for e in ws.sent))
        ws.client_leaves()

    run_session(ws, FakeRouter(n=3, every_s=0.01), script)
    assert writers == [("response.created", "Session._send_loop")] + [
        ("response.output_text.delta", "Session._respond")] * 3 + [("response.completed", "Session._send_loop")]
    assert [e["seq"] for e in ws.of("a")[1:-1]] == [0, 1, 2]


def test_a_delta_written_directly_to_a_reader_that_never_reads_ends_in_slow_consumer():
    """A direct write that the socket does not take within ``slow_reader_timeout_s`` ends the response
    with ``slow_consumer``, as a full queue does; the connection lives on."""
    class Stalled(FakeSocket):
        async def send_text(self, text: str) -> None:
            if json.loads(text)["type"] == "response.output_text.delta" and not self.sent_one:
                self.sent_one = True
                await asyncio.sleep(3600)  # a client that stopped reading
            await super().send_text(text)

    ws = Stalled()
    ws.sent_one = False
    router = FakeRouter(n=3, every_s=0.01)

    async def script(ws):
        ws.client_sends({"type": "response.create", "id": "a", "model": "m", "input": "x"})
        await until(lambda: any(e.get("code") == "slow_consumer" for e in ws.sent))
        ws.client_sends({"type": "response.create", "id": "b", "model": "m", "input": "x"})
        await until(lambda: any(e["type"] == "response.completed" for e in ws.of("b")))
        ws.client_leaves()

    run_session(ws, router, script, slow_reader_timeout_s=0.3)
    assert router.logs["a"] == ["cancelled"] and router.logs["b"] == ["finished"]


async def _watch(session: Session, peak: list) -> None:
    while True:
        peak.append(session.out.qsize())
        await asyncio.sleep(0.001)


def test_an_oversized_frame_closes_with_1009():
    ws, router = FakeSocket(), FakeRouter()

    async def script(ws):
        ws.client_sends({"type": "response.create", "id": "a", "model": "m", "input": "x" * 5000})

    run_session(ws, router, script, max_frame_bytes=4096)
    assert ws.closed == CLOSE_TOO_BIG
    assert ws.sent[-1]["code"] == "frame_too_large"


def test_after_its_close_the_server_reads_on_to_the_clients_close_reply():
    """Found by the fuzz (an example that took 10 s): a client that flooded frames after one too large
    heard the close only after 10 s, the WebSocket layer's close timeout: nobody read its queue of
    unread frames, so it never reached the client's close reply."""
    ws, router = FakeSocket(), FakeRouter()

    async def script(ws):
        ws.client_sends("x" * 5000)
        for i in range(50):
            ws.client_sends({"type": "response.cancel", "id": f"x{i}"})

    run_session(ws, router, script, max_frame_bytes=4096)
    assert ws.closed == CLOSE_TOO_BIG and ws.incoming.empty()  # read (and dropped) to the close reply


def test_an_oversized_binary_frame_closes_with_1009_too():
    """A binary frame over the limit got binary_frame and the connection lived on, unlike a text frame
    of the same size (and unlike docs/protocol.md)."""
    ws, router = FakeSocket(), FakeRouter()

    async def script(ws):
        ws.incoming.put_nowait({"type": "websocket.receive", "bytes": b"x" * 5000})

    run_session(ws, router, script, max_frame_bytes=4096)
    assert (ws.closed, ws.sent[-1]["code"]) == (CLOSE_TOO_BIG, "frame_too_large")


def test_json_nested_deeper_than_the_parser_goes_is_invalid_json_and_the_connection_lives_on():
    """Found by the fuzz: ``json.loads`` raises ``RecursionError`` (not a ``ValueError``) past its
    recursion limit; it escaped the frame's handling and closed the connection."""
    ws, router = FakeSocket(), FakeRouter(n=1)

    async def script(ws):
        ws.client_sends("[" * 100_000 + "]" * 100_000)
        ws.client_sends('{"a": ' * 50_000 + "1" + "}" * 50_000)
        ws.client_sends("1" * 5000)  # an integer over Python's 4300-digit limit
        ws.client_sends({"type": "response.create", "id": "ok", "model": "m", "input": "x"})
        await until(lambda: any(e["type"] == "response.completed" for e in ws.sent))
        ws.client_leaves()

    run_session(ws, router, script)
    errors = [e for e in ws.sent if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["invalid_json"] * 3 and "nested too deeply" in errors[0]["message"]
    assert ws.of("ok")[-1]["type"] == "response.completed"


def test_the_frame_budget_refills_and_runs_into_debt():
    budget = FrameBudget(rate=100.0, burst=3)
    assert [budget.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = budget.take()
    assert 0.019 < wait <= 0.02 and not budget.exhausted  # owes one frame, then needs one: 20 ms at 100/s
    assert budget.take() > wait  # sending on digs deeper
    refused = 2
    while not budget.exhausted:
        budget.take()
        refused += 1
    assert refused in (3, 4)  # owes a whole burst (a little refills meanwhile)
    time.sleep(budget.take() + 0.001)
    assert budget.take() == 0.0  # paid off: the wait it named was enough


def test_frames_over_the_rate_are_refused_then_a_client_that_sends_on_is_closed_with_1008():
    ws, router = FakeSocket(), FakeRouter(n=1)

    async def script(ws):
        for i in range(4):  # the burst: handled
            ws.client_sends({"type": "response.cancel", "id": f"c{i}"})
        ws.client_sends({"type": "response.create", "id": "over", "model": "m", "input": "x"})
        await until(lambda: any(e.get("code") == "rate_limited" for e in ws.sent))
        wait = next(e["retry_after"] for e in ws.sent if e.get("code") == "rate_limited")
        await asyncio.sleep(wait + 0.05)  # a client that waits as told is served
        ws.client_sends({"type": "response.create", "id": "later", "model": "m", "input": "x"})
        await until(lambda: any(e["type"] == "response.completed" for e in ws.sent))
        for i in range(20):  # one that does not is closed
            ws.client_sends({"type": "response.cancel", "id": f"f{i}"})

    run_session(ws, router, script, frames_per_s=2.0, frame_burst=4)
    limited = [e for e in ws.sent if e.get("code") == "rate_limited"]
    assert limited[0]["id"] == "over" and 0.9 < limited[0]["retry_after"] <= 1.0  # the frame's id: resend it
    assert ws.of("over") == [limited[0]] and ws.of("later")[-1]["type"] == "response.completed"
    assert (ws.closed, ws.reason) == (CLOSE_POLICY, "frame rate limit exceeded")
    assert 4 <= len(limited) <= 6  # a burst's worth of refusals (a little refills meanwhile)


def test_idle_connections_close_and_old_ones_drain():
    ws, router = FakeSocket(), FakeRouter()

    async def nothing(ws):
        pass

    run_session(ws, router, nothing, idle_timeout_s=0.2)
    assert ws.closed == CLOSE_NORMAL

    ws, router = FakeSocket(), FakeRouter(n=40, every_s=0.01)

    async def script(ws):
        ws.client_sends({"type": "response.create", "id": "a", "model": "m", "input": "x"})
        await asyncio.sleep(0.3)  # past the maximum age while "a" still runs
        ws.client_sends({"type": "response.create", "id": "b", "model": "m", "input": "x"})

    run_session(ws, router, script, max_connection_age_s=0.2)
    assert ws.of("a")[-1]["type"] == "response.completed"  # the running response finished
    assert ws.of("b")[-1]["code"] == "connection_draining"
    assert ws.closed == CLOSE_GOING_AWAY
