"""The fast lane's door: a WebSocket that the ring's head chip serves itself, inside its loop.

Why: a first token through the gateway crosses a front door process (a WebSocket frame in, the
router, a send to the head, the head's answer back, a frame out), whose wake-ups, sends and Python
are a large part of a warm first token on a small host (docs/front-doors.md). The door puts the
WebSocket in the head chip's own process and its select loop (``sharding.ring.Head``): a
``response.create`` frame is read, parsed and tokenized between two steps, the request joins the
next step, and the first token's frame is written when the step ends. No other process wakes on
the way. The frames and their JSON are read and written by ``serve.lanes.ws_frames``; this module
is the protocol.

It speaks the gateway's protocol (``docs/protocol.md``, ``fastmode.responses.v1``) at
``/v1/responses`` for the fast model only: ``response.create`` and ``response.cancel`` in;
``response.created``, ``response.output_text.delta``, ``response.completed`` (usage, cached tokens,
timing, cost units, the response's chip-to-chip hops), ``response.cancelled`` and ``error`` out,
with the gateway's error codes. It keeps the gateway's limits (``gateway`` section): API keys on the
upgrade (header or subprotocol), frame size, frames a second, responses in flight and connections
per key, the upgrade's deadline, the idle timeout and the connection's maximum age (then new
responses get ``connection_draining``, and the connection closes with 1001 once its last one ends).
A client that stops reading is dropped once
``max_pending_chars`` of its frames are unsent (the head never blocks on a socket), and a
connection that goes away frees its sequences (the head drops a client's requests).

Not here (the gateway serves them): other models and lanes, ``previous_response_id`` and ``store``,
TLS (the door is off when ``http`` has TLS), traces (the door records the lane's metrics: requests by
outcome, time to first token and per output token).
``response.created`` leaves with the first token, or at the head's next flush (``FLUSH_S``) if the
request waits for a slot: writing it at once would put a send before the prefill.

The gateway hands out the door's address (``GET /v1/door``); ``Door`` objects live in the head's
process only, built there from a picklable ``DoorSpec``.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer
from websockets.http11 import Request
from websockets.protocol import State

from sharding.ring import step_infos
from sharding.scheduler import validate_request
from sharding.transport import LinkClosed

from .. import metrics
from ..auth import key_of, subprotocol_bearer
from ..chat import end_of_turn_ids
from ..errors import InvalidRequest, LaneUnavailable, UnknownModel, UnsupportedParameter, to_event
from ..protocol import VERSION
from ..request import GenerateRequest
from ..websocket import (CLOSE_GOING_AWAY, CLOSE_NORMAL, CLOSE_POLICY, REASONS, FrameBudget, error_event,
                         error_from, frame_id)
from .step_spans import HopTotals
from .detokenizer import TextStream
from .prompt_ids import PromptIds
from .sampling import default_max_tokens, engine_request, generation_defaults, output_budget
from .ws_frames import (FrameReader, decode_json, encode_json, offered_subprotocols, server_protocol,
                        text_frame)

PATH = "/v1/responses"
UNAVAILABLE_RETRY_S = 5.0
"""``retry_after`` of the responses a failed ring ends (the lane replica rebuilds it)."""


@dataclass(frozen=True)
class DoorSpec:
    """What a head chip needs to open its door (sent to the chip's process; ``open`` runs there).

    Args:
        model_id: the fast model's served id (the only ``model`` the door takes).
        model_path: its checkpoint (the tokenizer).
        price: the fast lane's price (cost units per 1,000 tokens).
        host: the address to bind (``http.host``: loopback stays loopback); ``port`` 0: any free one.
        keys: the accepted API keys (empty: none needed, as on the gateway).
        limits: the ``gateway`` config section's values (``GatewayConfig``).
        chat_template, chat_template_kwargs: the fast model's (``models.fast``), as ``Lane`` takes them.
    """

    model_id: str
    model_path: str
    price: float
    host: str
    port: int = 0
    keys: frozenset[str] = frozenset()
    limits: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def open(self, model_config, max_len: int) -> Door:
        return Door(self, model_config, max_len)


class Door:
    """The listening socket and its connections, driven by the head's loop (``sharding.ring.Head``):
    ``server`` is watched for new connections (``accept``), each connection is one of the head's
    clients (``DoorConnection``), ``want_write`` are the sockets with frames still to send, and
    ``deadline``/``expired`` time out upgrades and idle connections."""

    def __init__(self, spec: DoorSpec, model_config, max_len: int) -> None:
        from ..config import GatewayConfig

        self.spec, self.model_config, self.max_len = spec, model_config, max_len
        self.limits = GatewayConfig.model_validate(spec.limits)
        self.tokenizer = Tokenizer.from_file(f"{spec.model_path}/tokenizer.json")
        self.prompt_ids = PromptIds.for_model(spec.model_path, self.tokenizer, chat_template=spec.chat_template,
                                              chat_template_kwargs=spec.chat_template_kwargs, kept_tokens=0)
        """The prompt's ids, as every lane's (no conversations here: no prompt kept for a next turn); a
        text's from kept words' ids (``serve.lanes.word_ids``): shorter than the tokenizer's own encode
        in a process whose caches a step has just emptied."""
        self.stop_ids = end_of_turn_ids(spec.model_path)
        """The fast model's end-of-turn ids (``Lane.stop_ids``)."""
        self.sampling_defaults = generation_defaults(spec.model_path)
        """Its sampling defaults (``Lane.sampling_defaults``)."""
        self.max_tokens = default_max_tokens(spec.model_path)
        """Its default ``max_output_tokens`` cap (``Lane.max_tokens``)."""
        self.server = socket.create_server((spec.host, spec.port), family=socket.AF_INET6 if ":" in spec.host
                                           else socket.AF_INET, backlog=128)
        self.server.setblocking(False)
        self.port = self.server.getsockname()[1]
        self.connections: dict[socket.socket, DoorConnection] = {}
        self.per_key: Counter[str] = Counter()
        self._serial = itertools.count()
        self.abort = None
        """Set by the head: ``abort(request_id)`` drops one of its requests (a stop string, a cancel)."""
        self.served = 0

    def accept(self) -> DoorConnection | None:
        try:
            sock, _ = self.server.accept()
        except OSError:  # gone before it was taken
            return None
        conn = DoorConnection(self, sock, next(self._serial))
        self.connections[sock] = conn
        return conn

    def want_write(self) -> list[socket.socket]:
        return [c.sock for c in self.connections.values() if c.out]

    def writable(self, socks: list[socket.socket]) -> list[DoorConnection]:
        """Write what the sockets in ``socks`` will take; answers the connections that broke."""
        broken = []
        for sock in socks:
            conn = self.connections.get(sock)
            if conn is not None and not conn.write():
                broken.append(conn)
        return broken

    def flush(self) -> list[DoorConnection]:
        """Write every connection's pending frames (the head calls this at each flush of its
        outputs); answers the connections that broke."""
        return [c for c in list(self.connections.values()) if c.out and not c.write()]

    def deadline(self) -> float | None:
        """The next ``time.monotonic()`` at which a connection times out, if any."""
        return min((d for c in self.connections.values() if (d := c.deadline()) is not None), default=None)

    def expired(self, now: float) -> list[DoorConnection]:
        """The connections to drop now: an upgrade that did not come in time, an idle connection
        (closed with 1000 first), one past ``max_connection_age_s`` with nothing in flight (1001).
        One past its age with responses in flight drains instead: it refuses new ones and closes
        once they end (``DoorConnection.drained``)."""
        out = []
        for conn in list(self.connections.values()):
            d = conn.deadline()
            if d is not None and d <= now:
                if conn.proto.state is State.OPEN:
                    if now >= conn.opened + self.limits.max_connection_age_s:
                        conn.draining = True
                        conn.drained()
                        if conn.proto.state is State.OPEN:
                            continue  # responses in flight: it closes once they end
                    else:
                        conn.proto.send_close(CLOSE_NORMAL)
                    conn.write()
                out.append(conn)
        return out

    def forget(self, conn: DoorConnection) -> None:
        if self.connections.pop(conn.sock, None) is not None and conn.key is not None:
            self.per_key[conn.key] -= 1
            if self.per_key[conn.key] <= 0:
                del self.per_key[conn.key]

    def close(self) -> None:
        for conn in list(self.connections.values()):
            conn.close()
        self.server.close()


@dataclass
class _Response:
    rid: str
    n_prompt: int
    text: TextStream
    arrived: float
    created_sent: bool = False
    seq: int = 0
    n_out: int = 0
    cached: int = 0
    first: float | None = None
    last: float | None = None
    hops: HopTotals = field(default_factory=HopTotals)


class DoorConnection:
    """One WebSocket connection: a client of the head (``read_messages``, ``send``, ``close``,
    ``sock``, as a client ``Link`` offers them)."""

    def __init__(self, door: Door, sock: socket.socket, serial: int) -> None:
        self.door, self.sock = door, sock
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        limits = door.limits
        self.proto = server_protocol(VERSION, limits.max_frame_bytes)  # as the gateway: VERSION if offered
        self.frames = FrameReader(self.proto)
        self.prefix = f"door{serial}:"
        """The head's request ids of this connection's responses: the prefix, then the client's id
        (ids are the client's to choose, and the head's are shared by all its clients)."""
        self.key: str | None = None
        self.out = bytearray()
        self._eof = False
        self.opened = self.last_activity = time.monotonic()
        self.budget = FrameBudget(limits.frames_per_s, limits.frame_burst)
        self.responses: dict[str, _Response] = {}
        self.draining = False
        """Past ``max_connection_age_s``: new responses are refused, and the connection closes (1001)
        once the ones in flight end."""
        self._closing = False
        self._pending_metrics: list[tuple] = []
        """Metrics of responses that ended since the last write (``serve.metrics`` calls): recorded
        after it, not on the way to a client's frame."""

    # -- timing out ------------------------------------------------------------------------------
    def deadline(self) -> float | None:
        """When this connection times out: its upgrade, and a closing handshake the server began,
        within ``header_timeout_s`` (a client that never answers a close holds nothing for long);
        ``max_connection_age_s`` after it opened (then it drains); with nothing in flight,
        ``idle_timeout_s`` after it last sent anything."""
        limits = self.door.limits
        if self.proto.state is State.CONNECTING:
            return self.opened + limits.header_timeout_s
        if self.proto.state is not State.OPEN:
            return self.last_activity + limits.header_timeout_s
        age = self.opened + limits.max_connection_age_s
        if self.responses:
            return None if self.draining else age
        return min(age, self.last_activity + limits.idle_timeout_s)

    def drained(self) -> None:
        """A draining connection whose last response has ended closes (1001)."""
        if self.draining and not self.responses and self.proto.state is State.OPEN:
            self.proto.send_close(CLOSE_GOING_AWAY, REASONS[CLOSE_GOING_AWAY])
            self.last_activity = time.monotonic()  # the closing handshake's deadline runs from here

    # -- from the client -------------------------------------------------------------------------
    def read_messages(self) -> list[tuple]:
        """What came from the client, as the head's commands (``add``/``abort``); ``LinkClosed``
        once the connection is over."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError as e:
            raise LinkClosed(str(e)) from None
        if not data:
            self.proto.receive_eof()
            raise LinkClosed("the client closed the connection")
        self.last_activity = time.monotonic()
        commands = self.frames.feed(data, self)
        self.drained()
        self._queue()
        if not self.write() or self.proto.state is State.CLOSED or self._closing:
            if commands:  # a connection closing after its last frame: nothing of it starts
                commands = []
            raise LinkClosed("closed")
        return commands

    # -- the frame reader's handler (``ws_frames.FrameHandler``) -----------------------------------
    def on_upgrade(self, request: Request) -> None:
        door = self.door
        if request.path.split("?", 1)[0] != PATH:
            response = self.proto.reject(404, f"Not found: this door serves the fast lane's WebSocket at {PATH}\n")
        else:
            header = request.headers.get("Authorization") or subprotocol_bearer(offered_subprotocols(request))
            key = key_of(door.spec.keys, header)
            response = self.proto.accept(request)
            if response.status_code == 101:
                # As on the gateway: a refused key or one over its limit is accepted, then closed
                # with 1008 (a browser sees a close code and reason, never a refused upgrade's status).
                self.proto.send_response(response)
                limit = door.limits.max_connections_per_key
                if key is None:
                    self.proto.send_close(CLOSE_POLICY, "missing or wrong API key")
                elif door.per_key[key] >= limit:
                    self._event(error_event("too_many_connections", f"this API key holds {limit} connections to "
                                            "this door, its limit; close one, or use one for many responses"))
                    self.proto.send_close(CLOSE_POLICY, f"too many connections for this API key (limit {limit})")
                else:
                    self.key = key
                    door.per_key[key] += 1
                    return
                self._closing = True
                return
        self.proto.send_response(response)
        self._closing = True

    def _budget(self, text: bytes | None) -> bool:
        """Spend a frame of the connection's budget; ``False`` (after saying so) if over it."""
        wait = self.budget.take()
        if not wait:
            return True
        limits = self.door.limits
        self._event(error_event("rate_limited", f"more than {limits.frames_per_s:g} frames a second "
                                f"({limits.frame_burst} at once): this frame was not handled; send it again after "
                                "retry_after seconds", frame_id(text), retry_after=round(wait, 3)))
        if self.budget.exhausted:
            self.proto.send_close(CLOSE_POLICY, REASONS[CLOSE_POLICY])
            self.last_activity = time.monotonic()  # the closing handshake's deadline runs from here
        return False

    def on_binary(self) -> None:
        if self._budget(None):
            self._event(error_event("binary_frame", "frames must be text (JSON); binary frames are not accepted"))

    def on_text(self, data: bytes) -> list[tuple]:
        """A client's event, as the head's commands (``add``/``abort``)."""
        if not self._budget(data):
            return []
        try:
            event = decode_json(data)
        except InvalidRequest as e:
            return self._error("invalid_json", e.message)
        if not isinstance(event, dict):
            return self._error("invalid_event", "an event must be a JSON object")
        kind, rid = event.get("type"), event.get("id")
        if kind == "response.create":
            if not isinstance(rid, str) or not rid:
                return self._error("invalid_request", "response.create needs an id (a non-empty string)")
            if rid in self.responses:
                return self._error("duplicate_id", f"a response with id {rid!r} is already in flight on this "
                                   "connection", rid)
            if self.draining or time.monotonic() >= self.opened + self.door.limits.max_connection_age_s:
                self.draining = True  # past its age at this request, whenever the loop notices the deadline
                return self._error("connection_draining", "this connection has reached its maximum age; open a "
                                   "new one", rid)
            if len(self.responses) >= self.door.limits.max_in_flight:
                return self._error("too_many_in_flight", f"at most {self.door.limits.max_in_flight} responses "
                                   "in flight per connection", rid)
            try:
                return [self._create(rid, {k: v for k, v in event.items() if k != "type"}, data)]
            except Exception as e:  # noqa: BLE001 - the request's own fault, typed by to_event
                ev = to_event(e, rid)
                self._pending_metrics.append((metrics.request, ("fast", ev["code"]), {}))
                return self._error(ev["code"], ev["message"], rid)
        if kind == "response.cancel":
            if not isinstance(rid, str) or rid not in self.responses:
                return self._error("unknown_id", f"no response with id {rid!r} is in flight",
                                   rid if isinstance(rid, str) else None)
            del self.responses[rid]
            self._pending_metrics.append((metrics.request, ("fast", "cancelled"), {}))
            self._event({"type": "response.cancelled", "id": rid})
            return [("abort", self.prefix + rid)]
        return self._error("unknown_event", f"unknown event type {kind!r}; expected 'response.create' or "
                           "'response.cancel'", rid if isinstance(rid, str) else None)

    def _create(self, rid: str, body: dict[str, Any], source: bytes) -> tuple:
        door = self.door
        req = GenerateRequest.parse(body, source)
        if req.model != door.spec.model_id:
            raise UnknownModel(f"model {req.model!r}: this door serves {door.spec.model_id!r} only; the "
                               "gateway serves every model")
        if req.previous_response_id is not None or req.store:
            raise InvalidRequest("previous_response_id and store: not served by the fast lane's door; the "
                                 "gateway's WebSocket serves conversations")
        if req.logprobs is not None:  # asked for as logprobs, or as OpenAI Responses' include
            field = "include" if req.include else "logprobs"
            raise UnsupportedParameter(f"{field}: log probabilities are not served by the fast lane's door; the "
                                       "gateway's WebSocket serves them")
        ids = door.prompt_ids.encode_prompt(req.prompt)[0]
        max_tokens = output_budget(req.max_output_tokens, len(ids), door.max_len, door.max_tokens, door.spec.model_id)
        params = engine_request(req.to_lane(self.prefix + rid), ids, max_tokens, defaults=door.sampling_defaults,
                                stop_ids=door.stop_ids, vocab_size=door.model_config.vocab_size).sampling()
        validate_request(door.model_config, door.max_len, self.prefix + rid, ids, params)
        self.responses[rid] = _Response(rid, len(ids), TextStream(door.tokenizer, req.stop_list, min_tokens=req.min_tokens),
                                        time.perf_counter())
        return ("add", self.prefix + rid, ids, params)

    def _error(self, code: str, message: str, rid: str | None = None) -> list[tuple]:
        self._event(error_event(code, message, rid))
        return []

    # -- from the head ---------------------------------------------------------------------------
    def send(self, msg: tuple) -> None:
        """A message of the head (``out``, ``error``, ``fatal``): frames for the client, written now
        if the socket takes them; ``LinkClosed`` if the client is gone or too far behind."""
        kind = msg[0]
        if kind == "out":
            self._outputs(msg[1], msg[2])
        elif kind == "error":
            r = self.responses.pop(msg[1].removeprefix(self.prefix), None)
            if r is not None:
                ev = to_event(msg[2], r.rid)
                self._pending_metrics.append((metrics.request, ("fast", ev["code"]), {}))
                self._event(error_from(ev, r.rid))
        elif kind == "fatal":
            err = LaneUnavailable(f"the fast lane's engine failed ({msg[1]}); it is being rebuilt, retry shortly",
                                  retry_after=UNAVAILABLE_RETRY_S)
            for r in list(self.responses.values()):
                ev = to_event(err, r.rid)
                self._event(error_from(ev, r.rid))  # with the error's retry_after
                self._pending_metrics.append((metrics.request, ("fast", ev["code"]), {}))
            self.responses.clear()
            self.proto.send_close(1011, "the fast lane's engine failed")
        self.drained()
        self._queue()
        if not self.write():
            raise LinkClosed("the client is gone or too far behind")

    def _outputs(self, outputs: list[tuple], raw_infos: list[tuple]) -> None:
        per: dict[str, list[tuple]] = defaultdict(list)
        for out in outputs:
            per[out[0]].append(out)
        if not per:
            return
        now = time.perf_counter()
        # A one-chip ring's steps have no hops: then nothing to unpack on the way to a first token.
        infos = step_infos(raw_infos) if any(raw[3] for raw in raw_infos) else []
        for head_rid, outs in per.items():
            r = self.responses.get(head_rid.removeprefix(self.prefix))
            if r is None:  # cancelled meanwhile
                continue
            for info in infos[-len(outs):]:  # the steps this request took part in
                r.hops.add(info.hops)
            if r.first is None:
                r.first, r.cached = now, outs[0][4]
                self._created(r)
            r.last = now
            tokens = [o[1] for o in outs]
            done, reason = outs[-1][2], outs[-1][3]
            text = r.text.push(tokens, stop_token=done and reason == "stop")
            tokens = tokens[:r.text.kept]  # past a stop string: not output (as the gateway's lane)
            r.n_out += len(tokens)
            if r.text.stopped or done:
                if not r.text.stopped:
                    text += r.text.flush()
                else:
                    reason = "stop"
                    if not done:
                        self.door.abort(head_rid)
            if text:
                self._event({"type": "response.output_text.delta", "id": r.rid, "seq": r.seq, "delta": text,
                             "tokens": len(tokens)})
                r.seq += 1
            if r.text.stopped or done:
                self._completed(r, reason)

    def _created(self, r: _Response) -> None:
        if not r.created_sent:
            r.created_sent = True
            self._event({"type": "response.created", "id": r.rid, "lane": "fast", "model": self.door.spec.model_id,
                         "input_tokens": r.n_prompt, "route": {"by": "model"}, "protocol": VERSION})

    def _completed(self, r: _Response, reason: str | None) -> None:
        del self.responses[r.rid]
        spec, now = self.door.spec, time.perf_counter()
        ttft = None if r.first is None else r.first - r.arrived
        decode = (r.n_out - 1) / (r.last - r.first) if r.first is not None and r.n_out > 1 and r.last > r.first else None
        total = r.n_prompt + r.n_out
        self._event({
            "type": "response.completed", "id": r.rid, "finish_reason": reason or "stop",
            "usage": {"input_tokens": r.n_prompt, "output_tokens": r.n_out, "total_tokens": total,
                      "input_tokens_details": {"cached_tokens": r.cached}},
            "timing": {"ttft_s": ttft, "engine_ttft_s": ttft, "decode_tokens_per_s": decode,
                       "total_s": now - r.arrived},
            "cost_units": spec.price * total / 1000, "lane": "fast", "model": spec.model_id,
            "hops": r.hops.per_pair()})
        self.door.served += 1
        tpot = (r.last - r.first) / (r.n_out - 1) if r.n_out > 1 else None
        self._pending_metrics += [(metrics.latency, ("fast",), {"ttft": ttft, "queue": None, "tpot": tpot}),
                                  (metrics.request, ("fast", "completed"), {})]

    def created_pending(self) -> None:
        """``response.created`` for the responses that wait for a slot (the head's flush)."""
        for r in self.responses.values():
            self._created(r)

    # -- to the client ---------------------------------------------------------------------------
    def _event(self, event: dict[str, Any]) -> None:
        if self.proto.state is State.OPEN:
            self._queue()  # the protocol's own frames (a pong) stay in order before this one
            self.out += text_frame(encode_json(event))

    def _queue(self) -> None:
        for chunk in self.proto.data_to_send():
            if chunk:
                self.out += chunk
            else:
                self._eof = True  # the protocol is done with the connection: close it once written

    def write(self) -> bool:
        """Send what the socket takes now; ``False`` if the connection is over (broken, closed,
        or more than ``max_pending_chars`` behind)."""
        self._queue()
        if self.out:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                return False
            del self.out[:sent]
        if self.out and len(self.out) > max(self.door.limits.max_pending_chars, 65536):
            return False  # slow_consumer: a reader this far behind is dropped (its requests with it)
        if not self.out and self._eof:
            return False
        if self._pending_metrics:
            for record, args, kwargs in self._pending_metrics:
                record(*args, **kwargs)
            self._pending_metrics.clear()
        return True

    def close(self) -> None:
        self.door.forget(self)
        for _ in self.responses:  # in flight as the connection went: their sequences are dropped
            metrics.request("fast", "cancelled")
        self.responses.clear()
        try:
            self.sock.close()
        except OSError:
            pass


__all__ = ["Door", "DoorConnection", "DoorSpec", "PATH"]
