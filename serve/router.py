"""``Router``: picks a lane per request and streams from the lane's replica directly.

It is a library, not a deployment: each front door (the gateway's WebSocket and HTTP routes, the
gRPC server) holds one, with the lanes' handles, so a request's chunks travel lane replica ->
front door, with no replica in between that only forwards them.

Routing (``pick``): ``model`` = the fast model's id -> fast lane; the full model's id -> priority
if ``service_tier`` is ``"priority"``, exact if ``"exact"`` (speculative decoding: the full model's
own output, the fast model drafting), else standard (``"default"``, ``"auto"`` or absent, as in
OpenAI's API); ``"auto"`` -> the fast lane when the prompt's difficulty score
(``serve.difficulty``) is above ``router.auto_threshold`` (``router.auto_fast_when: hard``, the
default, from the quality benchmark's policy sweep) or at most it (``easy``), else the full model on
the tier the request names, or ``router.auto_full_tier`` if it names none (or ``"auto"``).

Admission lives in the lane: a replica of a lane with ``admission: reject`` (priority by default)
refuses a stream beyond its ``max_num_seqs`` at once with ``overloaded``, before any engine work,
so the count is exact however many front doors there are. With several replicas, a refused
stream is offered to the lane up to ``replicas`` times (Serve routes each try to a replica with
fewer requests); then the caller gets ``overloaded`` with a retry hint, or, if the request says
``allow_spill``, a priority or exact request is served on standard. A request ``auto`` routed to
the full model spills on its own (the router chose the lane; standard is the same model, cheaper):
``route["spilled_from"]`` says so.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from sharding.sampling import GREEDY_BELOW

from . import metrics, telemetry
from .config import AppConfig, load_config
from .conversation import ResponseStore, Turn, as_messages, not_found
from .difficulty import DifficultyScorer
from .errors import Overloaded, UnknownModel, UnknownServiceTier, to_event, unwrap
from .lanes.lane import EXACT, FAST, LANES, PRIORITY, STANDARD
from .lanes.head_links import HeadConn
from .lanes.lane_links import LaneLinks
from .request import GenerateRequest, LaneRequest, Message

TIERS = {None: STANDARD, "auto": STANDARD, "default": STANDARD, "priority": PRIORITY, "exact": EXACT}
"""``service_tier`` -> the full model's lane."""
SPILLS = (PRIORITY, EXACT)
"""Lanes whose refused requests may be served on standard (``allow_spill``): the same model."""
AUTO = "auto"


class RouterStream:
    """One request's events (an async iterator); ``cancel()`` stops it and frees its engine sequence."""

    def __init__(self, events: AsyncIterator[dict[str, Any]]) -> None:
        self._events = events
        self._closing: asyncio.Future | None = None

    def __aiter__(self) -> RouterStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._events.__anext__()

    def cancel(self) -> None:
        """Close the stream (idempotent). A consumer cancelled while it waits has closed it already."""
        if self._closing is None and not self._events.ag_running:
            self._closing = asyncio.ensure_future(self._events.aclose())


class Router:
    """The application's core, held by each front door: ``stream(request)`` streams the events of
    one request (see ``serve.request``).

    Args:
        config: the validated deployment config (an ``AppConfig`` or its dict).
        fast, priority, standard, exact: handles of the lane deployments.
        stored: the handle of the ``StoredResponses`` deployment shared by every front door (``None``:
            this router keeps ``store: true`` responses itself).
    """

    def __init__(self, config: AppConfig | dict[str, Any], fast, priority, standard, exact, stored=None) -> None:
        self.config: AppConfig = config if isinstance(config, AppConfig) else load_config(config)
        self.handles = {FAST: fast, PRIORITY: priority, STANDARD: standard, EXACT: exact}
        self.ids = {FAST: self.config.models.fast.id, PRIORITY: self.config.models.full.id,
                    STANDARD: self.config.models.full.id, EXACT: self.config.models.full.id}
        self.tries = {name: getattr(self.config.lanes, name).replicas for name in LANES}
        self.in_flight = dict.fromkeys(LANES, 0)
        self.links = ({name: LaneLinks(self.handles[name], self.tries[name],
                                       self._open_head if name == FAST and self.config.router.head_links else None)
                       for name in LANES} if self.config.router.lane_links else {})
        fast = self.config.models.fast
        self.scorer = DifficultyScorer(fast.path, self.config.router.auto_max_tokens, chat_template=fast.chat_template,
                                       chat_template_kwargs=fast.chat_template_kwargs)
        self.warm_lanes: set[str] = set()
        self._warming: asyncio.Task | None = None
        g = self.config.gateway
        self.stored = stored
        self.store = ResponseStore(g.stored_responses, g.stored_response_bytes) if stored is None else None
        """Responses created with ``store: true``, when no shared deployment keeps them."""

    async def pick(self, req: GenerateRequest) -> tuple[str, dict[str, Any]]:
        """The lane for ``req`` and why (``{"by": "model"|"auto", "difficulty": ...}``).

        With the exact lane on vLLM (``lanes.exact.engine: vllm``), a sampled request (temperature at
        or above ``GREEDY_BELOW``) for the exact tier runs on the priority lane (``route["sampled_on"]``):
        the same full model, price and batch cap, without drafts. vLLM's speculative decoding
        (``draft_model``) on vLLM's CPU build does not keep the full model's distribution when it samples
        (docs/lanes.md), and the exact tier promises the full model's
        own output. fastmode's engine does (``sharding.speculative.accept_sampled``)."""
        lane, route = await self._pick(req)
        sampled = req.temperature is None or req.temperature >= GREEDY_BELOW  # None: the model's default, sampled
        if lane == EXACT and sampled and self.config.lanes.exact.engine == "vllm":
            lane, route = PRIORITY, {**route, "sampled_on": PRIORITY}
        return lane, route

    async def _pick(self, req: GenerateRequest) -> tuple[str, dict[str, Any]]:
        if req.service_tier not in TIERS:
            raise UnknownServiceTier(f"service_tier must be one of 'auto', 'default', 'priority', 'exact', got "
                                     f"{req.service_tier!r}")
        full_lane = TIERS[req.service_tier]
        models = self.config.models
        if req.model == models.fast.id:
            return FAST, {"by": "model"}
        if req.model == models.full.id:
            return full_lane, {"by": "model"}
        if req.model == AUTO:
            score = await asyncio.to_thread(self.scorer.score, req.prompt)
            if req.service_tier in (None, "auto"):
                full_lane = TIERS[self.config.router.auto_full_tier]
            r = self.config.router
            fast = score > r.auto_threshold if r.auto_fast_when == "hard" else score <= r.auto_threshold
            return FAST if fast else full_lane, {"by": "auto", "difficulty": round(score, 4),
                                                 "threshold": r.auto_threshold, "fast_when": r.auto_fast_when}
        raise UnknownModel(f"model {req.model!r} is not served here; choose one of "
                           f"{[models.full.id, models.fast.id, AUTO]}")

    def stream(self, request: dict[str, Any], history: ResponseStore | None = None, owner: str = "") -> RouterStream:
        """The events of one request: ``created``, ``delta``s, then ``done``, or one ``error``.

        ``history``: the caller's own completed responses (a WebSocket connection's), where
        ``previous_response_id`` is looked up first (then ``self.store``) and where this response
        is kept once it completes. ``owner``: ``serve.auth.owner_of`` the caller's API key; a stored
        response is found only by its owner."""
        return RouterStream(self.generate(request, history, owner))

    async def generate(self, request: dict[str, Any], history: ResponseStore | None = None, owner: str = ""
                       ) -> AsyncIterator[dict[str, Any]]:
        """Stream ``created``, ``delta``s and ``done`` for one request, or an ``error`` event.

        Each request is one trace span (OpenTelemetry GenAI conventions), continuing the caller's
        ``traceparent`` from ``metadata``; the lane's spans are its children. The span holds no
        prompt or output text, and an error's code but not its message (which may quote the
        request), unless ``telemetry.record_content`` asks for them.
        """
        meta = request.get("metadata") if isinstance(request, dict) else None
        chat = isinstance(request, dict) and isinstance(request.get("input"), list)
        op = "chat" if chat else "text_completion"
        model = request.get("model") if isinstance(request, dict) else None
        span = telemetry.tracer().start_span(
            f"{op} {model}", kind=SpanKind.SERVER, context=telemetry.extract(meta if isinstance(meta, dict) else None),
            attributes={"gen_ai.operation.name": op, "gen_ai.provider.name": "fastmode",
                        "gen_ai.request.model": str(model)})
        content = self.config.telemetry.record_content and span.is_recording()
        events = self._generate(request, span, history, owner)
        lane, outcome, output = None, "cancelled", []
        try:
            async for event in events:
                if span.is_recording():
                    _record(span, event, content)
                    if content and event["type"] == "delta":
                        output.append(event["text"])
                    elif content and event["type"] == "done":
                        span.set_attribute("gen_ai.output.messages", _messages(
                            [("assistant", "".join(output))], event["finish_reason"]))
                kind = event["type"]
                if kind == "created":
                    lane = event["lane"]
                elif kind == "done":
                    outcome = "completed"
                elif kind == "error":
                    outcome = event["code"]
                yield event
        except BaseException:
            span.set_attribute("fastmode.cancelled", True)
            raise
        finally:
            metrics.request(lane, outcome)
            await events.aclose()
            span.end()

    async def _generate(self, request: dict[str, Any], span, history: ResponseStore | None, owner: str = ""
                        ) -> AsyncIterator[dict[str, Any]]:
        arrived = time.perf_counter()
        rid = request.get("id") if isinstance(request, dict) and isinstance(request.get("id"), str) else None
        try:
            req = GenerateRequest.parse(request)
            rid = req.id or f"resp_{uuid.uuid4().hex}"
            prev = None
            conversation = as_messages(req.input)
            if req.previous_response_id is not None:
                prev = await self._previous(req.previous_response_id, history, owner)
                conversation = prev.messages + conversation
                req = req.model_copy(update={"input": [Message(role=r, content=c) for r, c in conversation]})
                if span.is_recording():
                    span.set_attribute("fastmode.previous_response_id", prev.id)
            if self.config.telemetry.record_content and span.is_recording():
                span.set_attribute("gen_ai.input.messages", _messages(conversation))
            # The engines key their sequences by this id: it must be unique among every front door's
            # requests, which the client's id is not (two connections may both send "r1").
            lane_request = req.to_lane(f"{rid}#{uuid.uuid4().hex[:16]}",
                                       telemetry.inject(span) if span.is_recording() else None)
            lane, route = await self.pick(req)
            prefer = prev.replica if prev is not None and prev.lane == lane else None
            lane, stream, accepted, replica = await self._open(lane, req, route, lane_request, prefer)
        except Exception as e:  # noqa: BLE001 - every failure becomes the stream's one error event
            yield to_event(e, rid)
            return
        keep = history is not None or req.store
        output: list[str] = []
        first, finished = None, False
        self.in_flight[lane] += 1
        try:
            yield {"type": "created", "id": rid, "lane": lane, "model": self.ids[lane],
                   "input_tokens": accepted["input_tokens"], "route": route}
            async for event in stream:
                event["id"] = rid
                if event["type"] == "delta":
                    if first is None:
                        first = time.perf_counter()
                    if keep:
                        output.append(event["text"])
                elif event["type"] == "done":
                    event["timing"]["engine_ttft_s"] = event["timing"]["ttft_s"]
                    event["timing"]["ttft_s"] = None if first is None else first - arrived
                    event["timing"]["total_s"] = time.perf_counter() - arrived
                    event["route"] = route
                    finished = True
                    if keep:  # before the client hears of it, so its next turn finds it
                        turn = Turn(rid, conversation + (("assistant", "".join(output)),), lane, replica, owner)
                        if history is not None:
                            history.put(turn)
                        if req.store:
                            await self._store(turn)
                yield event
        except Exception as e:  # noqa: BLE001
            finished = True
            yield to_event(e, rid)
        finally:
            self.in_flight[lane] -= 1
            if not finished:  # the caller went away: stop the lane's stream (and its engine sequence)
                stream.cancel()

    async def _previous(self, rid: str, history: ResponseStore | None, owner: str) -> Turn:
        """The kept turn ``rid``: the caller's own first, then the stored ones ``owner`` owns."""
        turn = history.get(rid, owner) if history is not None else None
        if turn is None:
            turn = self.store.get(rid, owner) if self.stored is None else await self.stored.get.remote(rid, owner)
        if turn is None:
            raise not_found(rid)
        return turn

    async def _store(self, turn: Turn) -> None:
        if self.stored is None:
            self.store.put(turn)
        else:
            await self.stored.put.remote(turn)

    async def _open(self, lane: str, req: GenerateRequest, route: dict[str, Any],
                    lane_request: LaneRequest, prefer: str | None = None) -> tuple[str, Any, dict[str, Any], str | None]:
        """Start the stream on ``lane`` (or spill from priority or exact to standard): the lane, its stream,
        its ``accepted`` event and the replica serving it (when known; ``prefer``: the replica to
        try first, the one holding the conversation's prefix); ``Overloaded`` if every try was refused."""
        refused = None
        tried: set[str] = set()
        for _ in range(self.tries[lane]):
            replica, stream = await self._start(lane, lane_request, tried, prefer)
            try:
                return lane, stream, await stream.__anext__(), replica  # ``accepted``, or the lane's refusal
            except BaseException as e:
                stream.cancel()  # a caller gone while it waited: the lane may have taken it already
                if not (isinstance(e, Exception) and isinstance(unwrap(e), Overloaded)):
                    raise
                refused = unwrap(e)
        retry = refused.retry_after
        if lane not in SPILLS:
            raise Overloaded(f"{refused.message}; retry after {retry} s", retry_after=retry)
        if not (req.allow_spill or route.get("by") == AUTO):
            raise Overloaded(f"{refused.message}; retry after {retry} s, or set allow_spill to be served on "
                             "standard", retry_after=retry)
        route["spilled_from"] = lane
        try:
            return await self._open(STANDARD, req, route, lane_request)
        except Overloaded:
            raise Overloaded(f"the {lane} and standard lanes are full; retry after {retry} s",
                             retry_after=retry) from None

    async def _start(self, lane: str, lane_request: LaneRequest, tried: set[str], prefer: str | None = None):
        """Start the stream on one of ``lane``'s replicas (not one in ``tried``; ``prefer`` first if
        it is up): over its link when one is up (``serve.lanes.lane_links``), else through Serve's handle.
        Returns ``(replica id or None, stream)``."""
        links = self.links.get(lane)
        if links is not None:
            opened = await links.open(lane_request, tried, prefer)
            if opened is not None:
                replica, stream = opened
                tried.add(replica)
                return replica, stream
        return None, self.handles[lane].options(stream=True).generate.remote(lane_request)

    async def _open_head(self, replica: str, head: dict[str, Any]) -> HeadConn:
        """This front door's own fast lane on ``replica``'s ring (``serve.lanes.head_links``)."""
        fast = self.config.models.fast
        return await HeadConn.open(replica, head, self.ids[FAST], fast.path,
                                   self.config.lanes.fast.model_dump(mode="json"),
                                   self.config.telemetry.model_dump(mode="json"), fast.chat_template,
                                   fast.chat_template_kwargs)

    def models(self) -> list[dict[str, Any]]:
        """The served model ids and the lanes behind each."""
        m = self.config.models
        return [{"id": m.full.id, "lanes": [STANDARD, PRIORITY, EXACT], "path": m.full.path},
                {"id": m.fast.id, "lanes": [FAST], "path": m.fast.path},
                {"id": AUTO, "lanes": [FAST, STANDARD, PRIORITY, EXACT], "path": None}]

    def start_warmup(self) -> asyncio.Task:
        """Warm this front door's path to every lane in the background (``warm``); from then on
        ``stats`` reports a lane ready only once it is warm. Call on the front door's event loop."""
        if self._warming is None:
            self._warming = asyncio.get_running_loop().create_task(self.warm())
        return self._warming

    async def warm(self) -> None:
        """Wait for each lane's replicas to be up (a lane replica is up once it has served its own
        warm-up requests, ``Lane.warmup``), open this front door's links to them, and run the
        ``auto`` scorer once, so that the first user's request finds everything started."""
        async def one(name: str) -> None:
            await self.handles[name].stats.remote()  # Serve holds the call until a replica is up
            if name in self.links:
                await self.links[name].connect()
            self.warm_lanes.add(name)

        await asyncio.to_thread(self.scorer.score, "def main():\n    return 0\n")
        await asyncio.gather(*(one(n) for n in LANES))

    @property
    def ready(self) -> bool:
        """Whether every lane is warm for this front door (always, if ``start_warmup`` was not called)."""
        return self._warming is None or len(self.warm_lanes) == len(LANES)

    async def doors(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """The fast lane's doors (``serve.lanes.door``): each replica's ring head's WebSocket, as
        ``{"url", "model", "replica"}``; none when the lane has no door or is rebuilding its ring.
        Serve routes each ask to some replica, so it asks twice per replica, as link discovery does."""
        handle, n = self.handles[FAST], self.tries[FAST]
        answers = await asyncio.wait_for(asyncio.gather(*(handle.link_address.remote() for _ in range(2 * n)),
                                                        return_exceptions=True), timeout_s)
        doors: dict[str, dict[str, Any]] = {}
        for where in answers:
            door = (where.get("head") or {}).get("door") if isinstance(where, dict) else None
            if door:
                host = f"[{door['host']}]" if ":" in door["host"] else door["host"]
                doors[where["replica"]] = {"url": f"ws://{host}:{door['port']}/v1/responses",
                                           "model": self.ids[FAST], "replica": where["replica"]}
        return sorted(doors.values(), key=lambda d: d["replica"])

    async def stats(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Each lane's load (from one of its replicas) and this front door's in-flight counts.

        A lane whose replica does not answer within ``timeout_s`` shows ``ready: false``; so does
        one still starting (``starting: true``: not yet warm, see ``start_warmup``).
        """
        async def one(name: str) -> dict[str, Any]:
            if self._warming is not None and name not in self.warm_lanes:
                error = self._warming.exception() if self._warming.done() else None
                return {"ready": False, "starting": error is None,
                        **({"error": f"warm-up failed: {type(error).__name__}: {error}"} if error else {})}
            try:
                s = await asyncio.wait_for(self.handles[name].stats.remote(), timeout_s)
                return {"ready": True, **s}
            except Exception as e:  # noqa: BLE001
                return {"ready": False, "error": f"{type(e).__name__}: {e}"}

        lanes = dict(zip(LANES, await asyncio.gather(*(one(n) for n in LANES)), strict=True))
        for name in LANES:
            lanes[name]["front_door_in_flight"] = self.in_flight[name]
            heads = self.links[name].heads if name in self.links else {}
            if heads:  # this front door's own lane on each replica's ring (serve.lanes.head_links)
                lanes[name]["head_links"] = {
                    "up": sum(h.alive for h in heads.values()), "in_flight": sum(h.lane.in_flight for h in heads.values()),
                    "cancelled": sum(h.lane.cancelled for h in heads.values())}
        status = ("ok" if all(v["ready"] for v in lanes.values())
                  else "starting" if any(v.get("starting") for v in lanes.values()) else "degraded")
        return {"status": status, "lanes": lanes}


def _messages(messages, finish_reason: str | None = None) -> str:
    """Messages as the GenAI conventions' ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (JSON)."""
    extra = {} if finish_reason is None else {"finish_reason": finish_reason}
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}], **extra}
                       for role, text in messages])


def _record(span, event: dict[str, Any], content: bool = False) -> None:
    """Put what ``event`` tells about the request on its span (an error's message only with ``content``:
    it may quote the request)."""
    kind = event["type"]
    if kind == "created":
        span.set_attributes({"gen_ai.response.id": event["id"], "fastmode.lane": event["lane"],
                             "gen_ai.response.model": event["model"], "fastmode.route.by": event["route"]["by"],
                             "gen_ai.usage.input_tokens": event["input_tokens"]})
        if "difficulty" in event["route"]:
            span.set_attribute("fastmode.route.difficulty", event["route"]["difficulty"])
    elif kind == "done":
        timing = event["timing"]
        span.set_attributes({"gen_ai.usage.output_tokens": event["usage"]["output_tokens"],
                             "gen_ai.response.finish_reasons": [event["finish_reason"]],
                             "fastmode.cost_units": event["cost_units"]})
        if timing.get("ttft_s") is not None:
            span.set_attribute("gen_ai.server.time_to_first_token", timing["ttft_s"])
        if timing.get("decode_tokens_per_s") is not None:
            span.set_attribute("fastmode.decode_tokens_per_s", timing["decode_tokens_per_s"])
    elif kind == "error":
        span.set_attributes({"error.type": event["code"]})
        span.set_status(Status(StatusCode.ERROR, event["message"][:200] if content else event["code"]))
