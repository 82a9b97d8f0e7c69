"""The persistent WebSocket at ``/v1/responses``: many requests per connection, multiplexed by id.

Client -> server: ``response.create`` (the ``GenerateRequest`` fields plus ``type``; ``id``
required) and ``response.cancel`` {id}. Server -> client: ``response.created``,
``response.output_text.delta`` (``seq`` counts this response's deltas from 0),
``response.completed``, ``response.cancelled``, ``error``. ``docs/protocol.md`` is the contract.

One task per request reads the router's stream and writes its deltas itself while nothing is
queued (no loop turn on the way to the client); one sender task writes every other frame, in order.
Bad input gets an ``error`` event and the connection lives on. A connection may send
``gateway.frames_per_s`` frames a second (``frame_burst`` at once): a frame over that budget is
answered ``rate_limited`` and not handled, and a client that sends on regardless is closed with
1008 (``FrameBudget``). A slow reader never makes the gateway buffer without bound: the send queue
is bounded, a request's deltas merge while it is full, and a request whose reader stays behind for
``slow_reader_timeout_s`` is cancelled with ``slow_consumer``. A disconnect cancels every request of
the connection, which frees their engine sequences.

Multi-turn: a completed response is kept by its connection (bounded, ``serve.conversation``);
``response.create`` with ``previous_response_id`` sends only the new input.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from typing import Any

from fastapi import WebSocket

from .config import GatewayConfig
from .conversation import ResponseStore
from .errors import InvalidRequest, clip, parse_json, to_event
from .protocol import VERSION


log = logging.getLogger(__name__)

# WebSocket close codes (RFC 6455 and the IANA registry).
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TOO_BIG = 1000, 1001, 1008, 1009
REASONS = {CLOSE_GOING_AWAY: "maximum connection age", CLOSE_POLICY: "frame rate limit exceeded",
           CLOSE_TOO_BIG: "frame too large"}
"""The close reason the server gives with each code it closes with (1000: idle, none)."""


class SlowConsumer(Exception):
    pass


def error_event(code: str, message: str, rid: str | None = None, **extra) -> dict[str, Any]:
    """An ``error`` event (the message clipped): the gateway's and the fast lane's door's."""
    return {"type": "error", "id": rid, "code": code, "message": clip(message), **extra}


class FrameBudget:
    """A token bucket of frames: ``rate`` a second, at most ``burst`` saved up.

    A frame over the budget is refused but spends its token all the same, so a client that sends on
    regardless runs into debt (the bucket goes below zero) instead of being let through again the
    moment a token comes back; one that owes ``burst`` frames has ignored ``burst`` refusals."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.at = float(burst), time.monotonic()

    def take(self) -> float:
        """Spend a token: 0 if the frame may be handled, else the seconds until the next one would be
        (when the debt is paid and a token saved)."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= 1
        return 0.0 if self.tokens >= 0 else (1 - self.tokens) / self.rate

    @property
    def exhausted(self) -> bool:
        """Whether the client owes a whole burst: it keeps sending through its refusals."""
        return self.tokens <= -self.burst


class Session:
    """One accepted WebSocket connection."""

    def __init__(self, ws: WebSocket, router, config: GatewayConfig, owner: str = "") -> None:
        self.ws, self.router, self.config = ws, router, config
        self.out: asyncio.Queue = asyncio.Queue(maxsize=config.send_queue_events)
        self.tasks: dict[str, asyncio.Task] = {}
        self.opened = time.monotonic()
        self.last_activity = self.opened
        self.draining = False
        self.gone = False
        """Set once a send failed: the client is gone, whatever frames of its are still to be read."""
        self.budget = FrameBudget(config.frames_per_s, config.frame_burst)
        self.owner = owner
        """``serve.auth.owner_of`` this connection's API key (stored responses are found by it)."""
        self._sending = asyncio.Lock()
        """Held while a frame is being written (by the send loop, or a response's own task: ``_send_now``)."""
        self.history = ResponseStore(config.responses_per_connection, config.response_bytes_per_connection)
        """This connection's completed responses, for ``previous_response_id`` (``serve.conversation``)."""

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_loop())
        close_code = CLOSE_NORMAL
        try:
            close_code = await self._receive_loop()
        finally:
            for task in list(self.tasks.values()):
                task.cancel()  # the client is gone or the connection is closing: free the engines
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
            if close_code is not None:
                await self._drain_outbox(timeout_s=2.0)
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            if close_code is not None:
                await self._close(close_code)

    async def _close(self, code: int) -> None:
        """Close with ``code`` while reading (and dropping) what the client still sends, up to its close
        reply. The WebSocket layer's close waits for its reader, which stops while its queue of unread
        frames is full: after a flood, the close would take its whole timeout (10 s) to reach the client."""
        async def discard() -> None:
            while (await self.ws.receive())["type"] != "websocket.disconnect":
                pass

        reader = asyncio.ensure_future(discard())
        try:
            await self.ws.close(code, reason=REASONS.get(code, ""))
            await asyncio.wait_for(reader, 2.0)
        except Exception:  # noqa: BLE001 - closed already, or a client that never answers
            pass
        finally:
            reader.cancel()

    # -- receiving ---------------------------------------------------------------------------
    async def _receive_loop(self) -> int | None:
        """Handle frames until the client leaves (``None``) or we close (the close code)."""
        while True:
            if self.gone:
                return None
            timeout = self._next_deadline()
            if timeout <= 0:
                if time.monotonic() - self.opened >= self.config.max_connection_age_s:
                    if not self.tasks:
                        return CLOSE_GOING_AWAY
                    self.draining = True  # no new requests; close once the running ones finish
                    await asyncio.sleep(0.05)
                    continue
                return CLOSE_NORMAL  # idle: nothing in flight and nothing received
            try:
                async with asyncio.timeout(None if math.isinf(timeout) else timeout):  # no task per frame
                    msg = await self.ws.receive()
            except TimeoutError:
                continue
            if msg["type"] == "websocket.disconnect":
                return None
            self.last_activity = time.monotonic()
            text, data = msg.get("text"), msg.get("bytes")
            if len((data or b"") if text is None else text.encode()) > self.config.max_frame_bytes:
                await self._emit(error_event("frame_too_large", f"a frame may carry at most "
                                        f"{self.config.max_frame_bytes} bytes"))
                return CLOSE_TOO_BIG
            if wait := self.budget.take():
                c = self.config
                await self._emit(error_event("rate_limited", f"more than {c.frames_per_s:g} frames a second "
                                        f"({c.frame_burst} at once): this frame was not handled; send it again "
                                        "after retry_after seconds", frame_id(text),
                                        retry_after=math.ceil(wait * 1e3) / 1e3))
                if self.budget.exhausted:
                    return CLOSE_POLICY
                continue
            if text is None:
                await self._emit(error_event("binary_frame", "frames must be text (JSON); binary frames are not "
                                        "accepted"))
                continue
            try:
                await self._handle(text)
            except Exception as e:  # noqa: BLE001 - a bug, not the client's fault: say so, serve on
                log.exception("a WebSocket frame could not be handled")
                await self._emit(error_from(to_event(e), None))

    def _next_deadline(self) -> float:
        now = time.monotonic()
        age_left = self.opened + self.config.max_connection_age_s - now
        if self.draining:
            return 0.0 if not self.tasks else 0.05
        idle_left = float("inf") if self.tasks else self.last_activity + self.config.idle_timeout_s - now
        return min(age_left, idle_left)

    async def _handle(self, text: str) -> None:
        try:
            event = parse_json(text, "the frame")
        except InvalidRequest as e:
            await self._emit(error_event("invalid_json", e.message))
            return
        if not isinstance(event, dict):
            await self._emit(error_event("invalid_event", "an event must be a JSON object"))
            return
        kind, rid = event.get("type"), event.get("id")
        if kind == "response.create":
            if not isinstance(rid, str) or not rid:
                await self._emit(error_event("invalid_request", "response.create needs an id (a non-empty string)"))
            elif rid in self.tasks:
                await self._emit(error_event("duplicate_id", f"a response with id {rid!r} is already in flight on "
                                        "this connection", rid))
            elif self.draining:
                await self._emit(error_event("connection_draining", "this connection has reached its maximum age; "
                                        "open a new one", rid))
            elif len(self.tasks) >= self.config.max_in_flight:
                await self._emit(error_event("too_many_in_flight", f"at most {self.config.max_in_flight} responses "
                                        "in flight per connection", rid))
            else:
                body = {k: v for k, v in event.items() if k != "type"}
                self.tasks[rid] = asyncio.create_task(self._respond(rid, body))
        elif kind == "response.cancel":
            task = self.tasks.get(rid) if isinstance(rid, str) else None
            if task is None:
                await self._emit(error_event("unknown_id", f"no response with id {rid!r} is in flight", rid
                                        if isinstance(rid, str) else None))
            else:
                task.cancel()
        else:
            await self._emit(error_event("unknown_event", f"unknown event type {kind!r}; expected "
                                    "'response.create' or 'response.cancel'", rid if isinstance(rid, str) else None))

    # -- one response ------------------------------------------------------------------------
    async def _respond(self, rid: str, body: dict[str, Any]) -> None:
        stream = self.router.stream(body, self.history, self.owner)
        seq, pending, finished = 0, None, False
        try:
            async for ev in stream:
                kind = ev["type"]
                if kind == "delta":
                    if pending is None:
                        pending = {"type": "response.output_text.delta", "id": rid, "seq": 0, "delta": ev["text"],
                                   "tokens": ev["tokens"]}
                        if "logprobs" in ev:
                            pending["logprobs"] = list(ev["logprobs"])
                    else:  # the reader is behind: merge into the delta still waiting
                        pending["delta"] += ev["text"]
                        pending["tokens"] += ev["tokens"]
                        if "logprobs" in ev:
                            pending.setdefault("logprobs", []).extend(ev["logprobs"])
                    if not self.out.full():
                        pending["seq"], seq = seq, seq + 1
                        event, pending = pending, None
                        if self._idle():  # nothing queued, no send running: write it from this task
                            await self._send_now(event)
                        else:
                            self.out.put_nowait(event)
                    elif len(pending["delta"]) > self.config.max_pending_chars:
                        raise SlowConsumer
                    continue
                if pending is not None:
                    pending["seq"], seq = seq, seq + 1
                    await self._put(pending)
                    pending = None
                if kind == "created":
                    await self._put({"type": "response.created", "id": rid, "lane": ev["lane"], "model": ev["model"],
                                     "input_tokens": ev["input_tokens"], "route": ev["route"],
                                     "protocol": VERSION})
                elif kind == "done":
                    finished = True
                    completed = {"type": "response.completed", "id": rid, "finish_reason": ev["finish_reason"],
                                 "usage": ev["usage"], "timing": ev["timing"], "cost_units": ev["cost_units"],
                                 "lane": ev["lane"], "model": ev["model"]}
                    for key in ("hops", "speculative"):  # the fast lane's hops, the exact lane's drafts
                        if key in ev:
                            completed[key] = ev[key]
                    await self._put(completed)
                elif kind == "error":
                    finished = True
                    await self._put(error_from(ev, rid))
        except asyncio.CancelledError:
            stream.cancel()
            if not finished:
                self._put_final({"type": "response.cancelled", "id": rid})
            raise
        except SlowConsumer:
            stream.cancel()
            self._put_final(error_event("slow_consumer", "the client did not read its deltas fast enough; "
                                            "the response was cancelled", rid))
        except Exception as e:  # noqa: BLE001 - reported on the connection, which lives on
            stream.cancel()
            self._put_final(error_from(to_event(e, rid), rid))
        finally:
            self.tasks.pop(rid, None)

    def _idle(self) -> bool:
        return self.out.empty() and not self._sending.locked() and not self.gone

    async def _send_now(self, event: dict[str, Any]) -> None:
        """Send ``event`` from the caller's task (``_idle`` held): a delta reaches the socket without a
        turn of the event loop for the send loop. A reader that does not take it within
        ``slow_reader_timeout_s`` is a slow consumer, as through the queue."""
        try:
            async with self._sending, asyncio.timeout(self.config.slow_reader_timeout_s):
                await self.ws.send_text(json.dumps(event))
        except TimeoutError:
            raise SlowConsumer from None
        except Exception:  # noqa: BLE001 - the client is gone (see _send_loop)
            self.gone = True

    async def _put(self, event: dict[str, Any]) -> None:
        if not self.out.full():  # no task (wait_for makes one) and no loop turn before the request goes on
            self.out.put_nowait(event)
            return
        try:
            await asyncio.wait_for(self.out.put(event), self.config.slow_reader_timeout_s)
        except TimeoutError:
            raise SlowConsumer from None

    def _put_final(self, event: dict[str, Any]) -> None:
        # A final event must not block a cancelled task; if the queue is full, make room for it
        # by dropping a pending delta of the same response (the response ends anyway).
        if self.out.full():
            return self._force(event)
        self.out.put_nowait(event)

    def _force(self, event: dict[str, Any]) -> None:
        kept = [e for e in _drain(self.out) if not (e.get("id") == event.get("id")
                                                    and e["type"] == "response.output_text.delta")]
        for e in kept[-(self.out.maxsize - 1):]:
            self.out.put_nowait(e)
        self.out.put_nowait(event)

    async def _emit(self, event: dict[str, Any]) -> None:
        """A connection-level event (bad input): queued like any other, dropped for a stalled reader."""
        with contextlib.suppress(SlowConsumer):
            await self._put(event)

    # -- sending -----------------------------------------------------------------------------
    async def _send_loop(self) -> None:
        while True:
            event = await self.out.get()
            if not self.gone:
                try:
                    async with self._sending:
                        await self.ws.send_text(json.dumps(event))
                except Exception:  # noqa: BLE001 - the client is gone (or the socket broke)
                    # From now on events are dropped, so nothing waits for room in the queue: a
                    # receive loop blocked in _put would otherwise wait slow_reader_timeout_s per
                    # frame still buffered before it could see the disconnect.
                    self.gone = True
            self.out.task_done()

    async def _drain_outbox(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self.out.join(), timeout_s)
        except TimeoutError:
            pass


def _drain(q: asyncio.Queue) -> list:
    items = []
    while not q.empty():
        items.append(q.get_nowait())
        q.task_done()
    return items


def frame_id(text: str | bytes | None) -> str | None:
    """The ``id`` of a frame that was not handled, if it has one (so that its sender knows which)."""
    with contextlib.suppress(InvalidRequest):
        event = parse_json(text, "the frame") if text is not None else None
        if isinstance(event, dict) and isinstance(event.get("id"), str):
            return event["id"]
    return None


def error_from(ev: dict[str, Any], rid: str | None) -> dict[str, Any]:
    """The WebSocket ``error`` event for ``ev`` (``serve.errors.to_event``): its code, message and
    ``retry_after``, without the HTTP status."""
    out = {"type": "error", "id": rid, "code": ev["code"], "message": ev["message"]}
    if ev.get("retry_after") is not None:
        out["retry_after"] = ev["retry_after"]
    return out
