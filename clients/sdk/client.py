"""The asyncio client: one lazily opened WebSocket per client, many responses multiplexed on it.

A reader task demultiplexes server events by response ``id`` into one queue per response. A
connection that drops fails every response in flight on it with ``ConnectionLost`` (or the typed
error the server gave as it closed: ``AuthenticationError`` for close code 1008, ...); the next
call opens a new connection, retrying with capped, jittered exponential backoff.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import ssl
import time
import uuid
from dataclasses import asdict, dataclass, fields
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from .errors import (AuthenticationError, ConnectionDraining, ConnectionFailed, ConnectionLost, FastmodeError,
                     PreviousResponseNotFound, from_code, from_event)
from .history import History

DEFAULT_BASE_URL = "ws://127.0.0.1:8000"
RESPONSES_PATH = "/v1/responses"
CLOSE_POLICY, CLOSE_TOO_BIG = 1008, 1009
_ENDS = ("response.completed", "response.cancelled", "error")
_CLOSED = "__connection_closed__"  # the sentinel event a dropped connection puts in each queue


# -- results -----------------------------------------------------------------------------------
def _usage(data: dict[str, Any] | None) -> Usage | None:
    usage = _pick(Usage, data)
    if usage is not None:
        usage.cached_tokens = (data.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return usage


def _pick(cls, data: dict[str, Any] | None):
    if not isinstance(data, dict):
        return None
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Usage:
    """Token counts of one response."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    """Input tokens the server reused from an earlier request's keys and values (prefix caching)."""


@dataclass
class Timing:
    """Server-side timing of one response (seconds; ``decode_tokens_per_s`` after the first token)."""

    ttft_s: float | None = None
    engine_ttft_s: float | None = None
    decode_tokens_per_s: float | None = None
    total_s: float | None = None


@dataclass
class Response:
    """A finished response. ``finish_reason`` is ``"stop"``, ``"length"`` or, for a response
    cancelled by the client, ``"cancelled"`` (then ``usage`` and ``timing`` are ``None``)."""

    id: str
    text: str = ""
    lane: str | None = None
    model: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    timing: Timing | None = None
    cost_units: float | None = None
    route: dict[str, Any] | None = None
    input_tokens: int | None = None
    speculative: dict[str, Any] | None = None
    """The exact lane's drafts: ``draft_tokens`` (the configured k), ``verify_steps``, ``drafted``, ``accepted``,
    ``acceptance_rate``, ``tokens_per_step`` (docs/protocol.md)."""
    hops: list[dict[str, Any]] | None = None
    """The fast lane's chip-to-chip hops, one entry per (sender, receiver) chip pair: ``src``, ``dst``,
    ``count``, ``seconds``, ``max_seconds``, ``bytes`` (docs/protocol.md); ``[]`` when the fast lane runs on
    one chip, ``None`` on the other lanes."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


# -- one WebSocket -----------------------------------------------------------------------------
class _Connection:
    """One open WebSocket and the reader task that routes its events to per-response queues."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.queues: dict[str, asyncio.Queue] = {}
        self.closed = False
        self.draining = False  # the server refused a create as ``connection_draining``: open a new one
        self.closed_by_client = False
        self.last_error: FastmodeError | None = None  # the last error event without an id
        self.close_code: int | None = None
        self.close_reason = ""
        self._tasks: set[asyncio.Task] = set()
        self.reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def usable(self) -> bool:
        return not self.closed and not self.draining

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                try:
                    event = json.loads(raw)
                except (TypeError, ValueError):
                    continue
                if not isinstance(event, dict):
                    continue
                rid = event.get("id")
                queue = self.queues.get(rid) if isinstance(rid, str) else None
                if queue is not None:
                    queue.put_nowait(event)
                    if event.get("type") in _ENDS:
                        self.queues.pop(rid, None)
                elif event.get("type") == "error" and rid is None:
                    self.last_error = from_event(event)
        except ConnectionClosed as e:
            frame = e.rcvd or e.sent
            if frame is not None:
                self.close_code, self.close_reason = frame.code, frame.reason
        except Exception:  # noqa: BLE001 - a broken transport: treated as a drop
            pass
        finally:
            if self.close_code is None and self.ws.close_code is not None:
                self.close_code, self.close_reason = self.ws.close_code, self.ws.close_reason or ""
            self.closed = True
            queues, self.queues = self.queues, {}
            for rid, queue in queues.items():
                queue.put_nowait({"type": _CLOSED, "id": rid})

    def close_error(self, rid: str | None = None) -> FastmodeError:
        """The error for a response that was in flight when this connection closed."""
        if self.close_code == CLOSE_POLICY:
            reason = self.close_reason or "the server closed the connection (code 1008): the API key is " \
                "missing or wrong"
            return AuthenticationError("unauthorized", reason, None, rid)
        if self.close_code == CLOSE_TOO_BIG:  # the server said why just before closing
            e = self.last_error or from_code("frame_too_large", "the server closed the connection "
                                             "(code 1009): a frame was too large")
            return type(e)(e.code, e.message, e.retry_after, rid)
        if self.closed_by_client:
            return ConnectionLost("connection_lost", "the client was closed while the response was in flight",
                                  None, rid)
        code = f" (code {self.close_code})" if self.close_code is not None else ""
        return ConnectionLost("connection_lost", f"the connection closed{code} while the response was in "
                              "flight", None, rid)

    def register(self, rid: str) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()
        self.queues[rid] = queue
        return queue

    async def send(self, event: dict[str, Any]) -> None:
        try:
            await self.ws.send(json.dumps(event))
        except ConnectionClosed:
            await asyncio.wait([self.reader], timeout=5)
            raise self.close_error(event.get("id")) from None

    def send_soon(self, event: dict[str, Any]) -> None:
        """Send ``event`` from a task (for callers that cannot await, such as a closing generator)."""
        if self.closed:
            return

        async def send() -> None:
            try:
                await self.ws.send(json.dumps(event))
            except Exception:  # noqa: BLE001 - the connection is gone, and with it the response
                pass

        task = asyncio.get_running_loop().create_task(send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self.closed_by_client = True
        await self.ws.close()
        await asyncio.wait([self.reader], timeout=5)


# -- one response ------------------------------------------------------------------------------
class ResponseStream:
    """One response as it streams. Iterate it for text deltas (``async for text in stream``);
    afterwards ``stream.result`` (or ``await stream.final()``) is the ``Response``.

    Leaving the loop early (``break``), leaving ``async with``, or ``await stream.cancel()`` cancels
    the response on the server. Iterating raises the typed ``FastmodeError`` the response ended with.
    """

    def __init__(self, conn: _Connection, rid: str, queue: asyncio.Queue, client: AsyncClient | None = None,
                 body: dict[str, Any] | None = None) -> None:
        self.id = rid
        self.resubmits = 0
        """How many times the request was sent again on a new connection (see ``AsyncClient``)."""
        self.replayed = False
        """Whether the client sent the whole conversation in place of ``previous_response_id`` (the
        server no longer had that response for the connection; see ``clients/sdk/history.py``)."""
        self._client, self._body = client, body
        self._conversation = client.history.conversation(body) if client is not None and body is not None else None
        self.lane: str | None = None
        self.model: str | None = None
        self.route: dict[str, Any] | None = None
        self.input_tokens: int | None = None
        self.result: Response | None = None
        """The finished ``Response`` (``None`` until the response has ended without an error)."""
        self.error: FastmodeError | None = None
        """The error the response ended with, if any."""
        self._conn, self._queue = conn, queue
        self._parts: list[str] = []
        self._early: list[str] = []  # deltas read before ``response.created`` (none from our server)
        self._cancel_sent = False

    @property
    def text(self) -> str:
        """The text received so far."""
        return "".join(self._parts)

    @property
    def done(self) -> bool:
        """Whether the response has ended (completed, cancelled or failed)."""
        return self.result is not None or self.error is not None

    def _response(self, finish_reason: str | None, **more: Any) -> Response:
        return Response(id=self.id, text=self.text, lane=self.lane, model=self.model,
                        finish_reason=finish_reason, route=self.route, input_tokens=self.input_tokens, **more)

    async def _next_event(self) -> dict[str, Any] | None:
        """Apply the next event; return it, or ``None`` once ended (raising the error it ended with)."""
        if self.error is not None:
            raise self.error
        if self.result is not None:
            return None
        event = await self._queue.get()
        while event.get("type") == _CLOSED and self._resubmittable():
            self.resubmits += 1
            try:
                self._conn, self._queue, body = await self._client._resubmit(self._body)
            except FastmodeError as e:
                self.error = e
                raise
            if body is not self._body:
                self._body, self.replayed = body, True
            event = await self._queue.get()
        kind = event.get("type")
        if kind == "response.created":
            self.lane, self.model = event.get("lane"), event.get("model")
            self.route, self.input_tokens = event.get("route"), event.get("input_tokens")
        elif kind == "response.output_text.delta":
            self._parts.append(event.get("delta", ""))
        elif kind == "response.completed":
            self.lane, self.model = event.get("lane", self.lane), event.get("model", self.model)
            self.result = self._response(event.get("finish_reason"), usage=_usage(event.get("usage")),
                                         timing=_pick(Timing, event.get("timing")),
                                         cost_units=event.get("cost_units"), speculative=event.get("speculative"),
                                         hops=event.get("hops"))
            if self._conversation is not None:  # the next turn may continue it on another connection
                self._client.history.put(self.id, self._conversation, self.text, self._conn,
                                         bool(self._body.get("store")))
        elif kind == "response.cancelled":
            self.result = self._response("cancelled")
        elif kind == "error":
            self.error = from_event(event)
            raise self.error
        elif kind == _CLOSED:
            self.error = self._conn.close_error(self.id)
            raise self.error
        return event

    def _resubmittable(self) -> bool:
        """Whether a response cut off by a dropped connection may be sent again: it produced no
        text yet (so nothing the caller saw is repeated), the caller did not cancel it, the server
        did not close for a reason of the request's own, and the client allows more resubmits."""
        conn = self._conn
        return (self._client is not None and self._body is not None and not self._parts and not self._early
                and not self._cancel_sent and not conn.closed_by_client
                and conn.close_code not in (CLOSE_POLICY, CLOSE_TOO_BIG)
                and self.resubmits < self._client.resubmit_attempts)

    async def _next_text(self) -> str | None:
        if self._early:
            return self._early.pop(0)
        while (event := await self._next_event()) is not None:
            if event.get("type") == "response.output_text.delta":
                return event.get("delta", "")
        return None

    async def _wait_created(self) -> None:
        while self.lane is None and not self.done:
            event = await self._next_event()
            if event is not None and event.get("type") == "response.output_text.delta":
                self._early.append(event.get("delta", ""))  # not expected: the server sends created first

    def __aiter__(self) -> AsyncIterator[str]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[str]:
        try:
            while (text := await self._next_text()) is not None:
                yield text
        finally:
            if not self.done:
                self._cancel_soon()

    def _cancel_soon(self) -> None:
        if not self._cancel_sent and not self.done:
            self._cancel_sent = True
            self._conn.send_soon({"type": "response.cancel", "id": self.id})

    async def cancel(self, timeout_s: float = 10.0) -> None:
        """Cancel the response and wait (up to ``timeout_s``) for the server to confirm it; then
        ``result.finish_reason`` is ``"cancelled"`` (or ``"stop"``/``"length"`` if it had finished)."""
        if self.done:
            return
        if not self._cancel_sent:
            self._cancel_sent = True
            try:
                await self._conn.send({"type": "response.cancel", "id": self.id})
            except FastmodeError:
                pass  # the connection is gone; the next event says so
        try:
            async with asyncio.timeout(timeout_s):
                while await self._next_event() is not None:
                    pass
        except FastmodeError:
            pass
        except TimeoutError:
            self.result = self._response("cancelled")

    async def final(self) -> Response:
        """Read the rest of the response and return it (raises the error it ended with)."""
        while await self._next_event() is not None:
            pass
        assert self.result is not None
        return self.result

    async def __aenter__(self) -> ResponseStream:
        return self

    async def __aexit__(self, *exc) -> None:
        if not self.done:
            await self.cancel()


class _StreamOpener:
    """What ``responses.stream(...)`` returns: ``await`` it, or use it with ``async with``."""

    def __init__(self, client: AsyncClient, body: dict[str, Any]) -> None:
        self._client, self._body = client, body
        self._stream: ResponseStream | None = None

    def __await__(self):
        return self.open().__await__()

    async def open(self) -> ResponseStream:
        self._stream = await self._client._start(self._body)
        return self._stream

    async def __aenter__(self) -> ResponseStream:
        return await self.open()

    async def __aexit__(self, *exc) -> None:
        if self._stream is not None and not self._stream.done:
            await self._stream.cancel()


class AsyncResponses:
    """``client.responses``: start responses."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    def stream(self, *, model: str, input: str | list[dict[str, str]], service_tier: str | None = None,
               max_output_tokens: int | None = None, temperature: float | None = None,
               top_p: float | None = None, stop: str | list[str] | None = None, seed: int | None = None,
               ignore_eos: bool | None = None, allow_spill: bool | None = None,
               metadata: dict[str, str] | None = None, id: str | None = None,
               previous_response_id: str | None = None, store: bool | None = None, **extra: Any) -> _StreamOpener:
        """Start a response and stream it: ``stream = await client.responses.stream(model=..., input=...)``
        (or ``async with client.responses.stream(...) as stream``). Returns once the server has
        admitted it (``stream.lane`` is set), raising its typed error if refused.

        ``input`` is a prompt string or a list of ``{"role", "content"}`` messages. Every other
        parameter is passed through as the ``response.create`` field of the same name (``None``
        leaves it to the server's default); ``extra`` carries fields this SDK does not name.
        ``id`` defaults to a fresh unique id. ``previous_response_id`` continues the conversation of
        a response completed earlier on this connection (or with ``store=True`` on any): send only
        the new input (the server joins it to that response's input and output).
        """
        if not isinstance(model, str):
            raise TypeError(f"model must be a string, got {type(model).__name__}")
        if not isinstance(input, (str, list)):
            raise TypeError(f"input must be a string or a list of messages, not {type(input).__name__}")
        body = {"model": model, "input": input, "service_tier": service_tier,
                "max_output_tokens": max_output_tokens, "temperature": temperature, "top_p": top_p,
                "stop": stop, "seed": seed, "ignore_eos": ignore_eos, "allow_spill": allow_spill,
                "metadata": metadata, "previous_response_id": previous_response_id, "store": store, **extra}
        body = {k: v for k, v in body.items() if v is not None}
        body["id"] = id or f"resp_{uuid.uuid4().hex}"
        return _StreamOpener(self._client, body)

    async def create(self, **params: Any) -> Response:
        """Run a response to its end and return it (same parameters as ``stream``)."""
        stream = await self.stream(**params)
        try:
            return await stream.final()
        finally:
            if not stream.done:  # interrupted (e.g. the caller's task was cancelled)
                stream._cancel_soon()


# -- the client --------------------------------------------------------------------------------
def responses_url(base_url: str) -> str:
    """The WebSocket URL of ``/v1/responses`` for ``base_url`` (``ws://``, ``wss://``, ``http(s)://``;
    a URL without a path gets ``/v1/responses`` appended, one with a path is used as is)."""
    parts = urlsplit(base_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path if parts.path not in ("", "/") else RESPONSES_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


class AsyncClient:
    """The asyncio fastmode client (see the package docstring for an example).

    ``base_url``: the server (``ws://host:port``, or ``wss://`` / ``https://`` for a server with TLS;
    ``/v1/responses`` is appended when there is no path).
    ``api_key``: sent as ``Authorization: Bearer``; default ``$FASTMODE_API_KEY`` (none if unset).
    ``ca_file``: PEM certificates to trust for ``wss://`` (e.g. a private CA or a self-signed server);
    default: the system's trust store (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` override it, as in OpenSSL).
    ``max_attempts``: how many times to try opening the connection before ``ConnectionFailed``;
    between tries it waits ``backoff_initial_s * 2**n`` capped at ``backoff_max_s``, times a random
    jitter in [0.5, 1]. ``open_timeout_s``: per try. ``ping_interval_s``: keepalive (``None``: off).

    A connection that drops (the gateway restarted, the network broke) fails the responses that
    had streamed text with ``ConnectionLost``; a response that had produced no text yet is sent
    again on a new connection, up to ``resubmit_attempts`` times, and the caller sees it stream as
    if nothing happened (``stream.resubmits`` counts it). Reconnecting for a resubmit keeps trying
    for ``reconnect_timeout_s`` (a restarting gateway takes seconds to listen again).

    ``previous_response_id`` across connections: the client keeps the conversations of the responses
    it completed (``history_responses`` and ``history_bytes`` at most, oldest evicted first) and, where
    the server no longer has the previous response for the connection (it completed on an earlier
    connection without ``store``, or the server answers ``previous_response_not_found``), sends the
    whole conversation as ``input`` instead, once (``stream.replayed``): the same prompt the server
    would have joined. A response the client does not know still fails with ``PreviousResponseNotFound``.

    ``door``: connect to the fast lane's door instead (the WebSocket its ring's head chip serves
    itself, ``docs/protocol.md``): the fast model only, without the gateway's process on the way to
    the first token. Its URL is asked of the gateway (``GET /v1/door``) at every connect, so a
    reconnect finds a door that moved with a rebuilt ring.
    """

    def __init__(self, base_url: str = DEFAULT_BASE_URL, api_key: str | None = None, *, max_attempts: int = 5,
                 backoff_initial_s: float = 0.25, backoff_max_s: float = 8.0, open_timeout_s: float = 10.0,
                 ping_interval_s: float | None = 20.0, ca_file: str | None = None, resubmit_attempts: int = 2,
                 reconnect_timeout_s: float = 60.0, history_responses: int = 64,
                 history_bytes: int = 4 * 2**20, door: bool = False) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if resubmit_attempts < 0:
            raise ValueError("resubmit_attempts must be at least 0")
        self.resubmit_attempts, self.reconnect_timeout_s = resubmit_attempts, reconnect_timeout_s
        self.history = History(history_responses, history_bytes)
        """The conversations of the responses this client completed (``clients/sdk/history.py``)."""
        self.url = responses_url(base_url)
        if ca_file is not None and not self.url.startswith("wss://"):
            raise ValueError(f"ca_file is for a wss:// (or https://) server, not {self.url}")
        self.ca_file = ca_file
        self.door = door
        self.api_key = api_key if api_key is not None else os.environ.get("FASTMODE_API_KEY")
        self.max_attempts, self.open_timeout_s = max_attempts, open_timeout_s
        self.ping_interval_s = ping_interval_s
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self.responses = AsyncResponses(self)
        self.connects = 0
        """How many connections this client has opened (reconnects included)."""
        self._conn: _Connection | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def backoff_s(self, attempt: int) -> float:
        """The wait after failed try number ``attempt`` (1-based): capped exponential, jittered."""
        return min(self.backoff_max_s, self.backoff_initial_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)

    async def _connection(self, deadline: float | None = None) -> _Connection:
        if self._closed:
            raise FastmodeError("client_closed", "this client has been closed")
        if self._conn is not None and self._conn.usable:
            return self._conn
        async with self._lock:
            if self._conn is None or not self._conn.usable:
                if deadline is None and self._conn is not None and self._conn.closed and \
                        not self._conn.closed_by_client and self._conn.close_code not in (1000, 1001):
                    # The last connection dropped (no close handshake): the gateway is probably
                    # restarting, so keep trying for a while rather than ``max_attempts`` times.
                    deadline = time.monotonic() + self.reconnect_timeout_s
                self._conn = await self._open(deadline)
            return self._conn

    async def _resubmit(self, body: dict[str, Any]) -> tuple[_Connection, asyncio.Queue, dict[str, Any]]:
        """Send ``body`` again on a working connection (opening one, for up to ``reconnect_timeout_s``);
        the body as sent (with the whole conversation if the new connection lacks the previous response)."""
        deadline = time.monotonic() + self.reconnect_timeout_s
        while True:
            conn = await self._connection(deadline)
            queue = conn.register(body["id"])
            sent = self.history.replay(body, conn) or body
            try:
                await conn.send({"type": "response.create", **sent})
                return conn, queue, sent
            except ConnectionLost:
                conn.queues.pop(body["id"], None)
                if time.monotonic() > deadline:
                    raise

    async def _open(self, deadline: float | None = None) -> _Connection:
        """Open a connection: up to ``max_attempts`` tries, or until ``deadline`` (``time.monotonic``)."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        # wss: the system's trust store, or ca_file's certificates (websockets refuses ssl= for ws://).
        wss = self.url.startswith("wss://")
        tls = {"ssl": ssl.create_default_context(cafile=self.ca_file)} if wss else {}
        last: BaseException | None = None
        attempt = 0
        while True:
            attempt += 1
            try:
                url = await self._door_url(headers) if self.door else self.url
                ws = await connect(url, additional_headers=headers, max_size=None,
                                   open_timeout=self.open_timeout_s, ping_interval=self.ping_interval_s,
                                   **tls)
            except InvalidURI as e:
                raise ConnectionFailed("connection_failed", f"invalid URL {self.url!r}: {e}") from e
            except ssl.SSLCertVerificationError as e:  # retrying will not help
                raise ConnectionFailed("connection_failed", f"{self.url}: the server's certificate is not "
                                       f"trusted ({e.verify_message}); pass ca_file (--ca-file) if it is "
                                       "signed by a private CA") from e
            except InvalidStatus as e:
                if e.response.status_code in (401, 403):
                    raise AuthenticationError("unauthorized", f"the server refused the API key "
                                              f"(HTTP {e.response.status_code})") from e
                last = e
            except (OSError, InvalidHandshake, TimeoutError) as e:
                last = e
            except ConnectionFailed:
                raise
            except FastmodeError as e:  # the door's address: not available yet (its ring is rebuilt)
                if isinstance(e, AuthenticationError):
                    raise
                last = e
            else:
                self.connects += 1
                return _Connection(ws)
            if deadline is None and attempt >= self.max_attempts:
                break
            wait = self.backoff_s(attempt)
            if deadline is not None and time.monotonic() + wait > deadline:
                break
            await asyncio.sleep(wait)
        raise ConnectionFailed("connection_failed", f"could not connect to {self.url} after "
                               f"{attempt} attempt(s): {type(last).__name__}: {last}") from last

    async def _door_url(self, headers: dict[str, str]) -> str:
        """The fast lane's door, asked of the gateway (``GET /v1/door``; one of them at random when the
        lane has several replicas). ``AuthenticationError`` for a refused key, ``ConnectionFailed`` when
        the server has no door at all; ``FastmodeError`` ``door_unavailable`` (retried) while its ring
        is rebuilt."""
        import httpx

        parts = urlsplit(self.url)
        base = urlunsplit(({"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme), parts.netloc, "", "", ""))
        verify: Any = ssl.create_default_context(cafile=self.ca_file) if parts.scheme == "wss" else True
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=self.open_timeout_s, verify=verify) as http:
            r = await http.get("/v1/door")
        if r.status_code in (401, 403):
            raise AuthenticationError("unauthorized", f"the server refused the API key (HTTP {r.status_code})")
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        if r.status_code == 200 and body.get("data"):
            return random.choice(body["data"])["url"]
        if r.status_code == 404 and body.get("code") == "door_unavailable" and body.get("retry_after") is None:
            raise ConnectionFailed("connection_failed", f"{base} serves no fast-lane door: {body.get('message')}")
        raise FastmodeError(body.get("code") or "door_unavailable", body.get("message") or f"GET /v1/door: HTTP "
                            f"{r.status_code}", retry_after=body.get("retry_after"))

    async def _start(self, body: dict[str, Any]) -> ResponseStream:
        deadline = None  # set once a connection drops under a create: then reconnect for a while
        dropped, replayed = 0, False
        for _ in range(4 + self.resubmit_attempts):  # a draining or dropped connection: retry on a new one
            conn = await self._connection(deadline)
            queue = conn.register(body["id"])
            sent = self.history.replay(body, conn) or body
            stream = ResponseStream(conn, body["id"], queue, self, sent)
            stream.resubmits, stream.replayed = dropped, replayed or sent is not body
            try:
                await conn.send({"type": "response.create", **sent})
                await stream._wait_created()
            except PreviousResponseNotFound:
                conn.queues.pop(body["id"], None)
                if sent is body and (again := self.history.replay(body, conn, force=True)) is not None:
                    body, replayed = again, True  # evicted on the server: send the conversation whole
                    continue
                raise
            except ConnectionDraining:
                conn.draining = True
                continue
            except ConnectionLost:
                if conn.closed_by_client or stream._parts or conn.close_code in (CLOSE_POLICY, CLOSE_TOO_BIG) \
                        or stream.resubmits >= self.resubmit_attempts and conn.close_code not in (1000, 1001):
                    raise
                dropped = stream.resubmits + (conn.close_code not in (1000, 1001))
                # The server closed an idle or aged connection just as we sent, or the connection
                # dropped (a gateway restarting): nothing was produced, so send it again.
                deadline = deadline or time.monotonic() + self.reconnect_timeout_s
                continue
            except BaseException:
                conn.queues.pop(body["id"], None)
                if not stream.done:
                    stream._cancel_soon()
                raise
            return stream
        raise ConnectionDraining("connection_draining", "every new connection was draining")

    async def close(self) -> None:
        """Close the connection; responses still in flight fail with ``ConnectionLost``."""
        self._closed = True
        if self._conn is not None:
            await self._conn.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


__all__ = ["AsyncClient", "AsyncResponses", "ResponseStream", "Response", "Usage", "Timing", "responses_url",
           "DEFAULT_BASE_URL"]
