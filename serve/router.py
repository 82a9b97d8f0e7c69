"""``Router``: picks a lane per request, enforces the priority lane's batch cap, relays the stream.

Routing (``pick``): ``model`` = the fast model's id -> fast lane; the full model's id -> priority
if ``service_tier`` is ``"priority"``, else standard (``"default"``, ``"auto"`` or absent, as in
OpenAI's API); ``"auto"`` -> the fast lane when the prompt's difficulty score
(``serve.difficulty``) is at most ``router.auto_threshold``, else the full model by tier.

Admission: a lane with ``admission: reject`` (priority by default) admits at most
``replicas x max_num_seqs`` streams; one more is rejected at once with ``overloaded`` and a
retry hint, or served on standard if the request says ``allow_spill``. The count lives here, so it
is exact with one router replica (the default); each lane replica also refuses a stream beyond
its own cap, and Serve never sends a replica more than ``max_num_seqs`` (its
``max_ongoing_requests``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from . import metrics, telemetry
from .config import AppConfig, load_config
from .difficulty import DifficultyScorer
from .errors import Overloaded, UnknownModel, UnknownServiceTier, to_event
from .lanes.lane import FAST, LANES, PRIORITY, STANDARD
from .request import GenerateRequest

TIERS = {None: STANDARD, "auto": STANDARD, "default": STANDARD, "priority": PRIORITY}
AUTO = "auto"


class Router:
    """The application's core: ``generate`` streams events for one request (see ``serve.request``).

    Args:
        config: the validated deployment config (as a dict).
        fast, priority, standard: handles of the lane deployments.
    """

    def __init__(self, config: dict[str, Any], fast, priority, standard) -> None:
        telemetry.setup("router")
        self.config: AppConfig = load_config(config)
        self.handles = {FAST: fast, PRIORITY: priority, STANDARD: standard}
        self.ids = {FAST: self.config.models.fast.id, PRIORITY: self.config.models.full.id,
                    STANDARD: self.config.models.full.id}
        lanes = self.config.lanes
        self.capacity = {name: cfg.replicas * cfg.max_num_seqs for name, cfg in
                         ((PRIORITY, lanes.priority), (STANDARD, lanes.standard)) if cfg.admission == "reject"}
        self.in_flight = dict.fromkeys(LANES, 0)
        self.scorer = DifficultyScorer(self.config.models.fast.path, self.config.router.auto_max_tokens)

    async def pick(self, req: GenerateRequest) -> tuple[str, dict[str, Any]]:
        """The lane for ``req`` and why (``{"by": "model"|"auto", "difficulty": ...}``)."""
        if req.service_tier not in TIERS:
            raise UnknownServiceTier(f"service_tier must be one of 'auto', 'default', 'priority', got "
                                     f"{req.service_tier!r}")
        full_lane = TIERS[req.service_tier]
        models = self.config.models
        if req.model == models.fast.id:
            return FAST, {"by": "model"}
        if req.model == models.full.id:
            return full_lane, {"by": "model"}
        if req.model == AUTO:
            score = await asyncio.to_thread(self.scorer.score, req.prompt)
            lane = FAST if score <= self.config.router.auto_threshold else full_lane
            return lane, {"by": "auto", "difficulty": round(score, 4),
                          "threshold": self.config.router.auto_threshold}
        raise UnknownModel(f"model {req.model!r} is not served here; choose one of "
                           f"{[models.full.id, models.fast.id, AUTO]}")

    def admit(self, lane: str, req: GenerateRequest, route: dict[str, Any]) -> str:
        """Reserve a stream on ``lane`` (or spill); raise ``Overloaded`` if it has no room."""
        cap = self.capacity.get(lane)
        if cap is not None and self.in_flight[lane] >= cap:
            retry = getattr(self.config.lanes, lane).retry_after_s
            if not (req.allow_spill and lane == PRIORITY):
                raise Overloaded(f"the {lane} lane is full ({cap} streams); retry after {retry} s, "
                                 "or set allow_spill to be served on standard", retry_after=retry)
            route["spilled_from"] = lane
            lane = STANDARD
            cap = self.capacity.get(lane)
            if cap is not None and self.in_flight[lane] >= cap:
                raise Overloaded(f"the priority and standard lanes are full; retry after {retry} s",
                                 retry_after=retry)
        self.in_flight[lane] += 1
        return lane

    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream ``created``, ``delta``s and ``done`` for one request, or an ``error`` event.

        Each request is one trace span (OpenTelemetry GenAI conventions), continuing the caller's
        ``traceparent`` from ``metadata``; the lane's spans are its children.
        """
        meta = request.get("metadata") if isinstance(request, dict) else None
        chat = isinstance(request, dict) and isinstance(request.get("input"), list)
        op = "chat" if chat else "text_completion"
        model = request.get("model") if isinstance(request, dict) else None
        span = telemetry.tracer().start_span(
            f"{op} {model}", kind=SpanKind.SERVER, context=telemetry.extract(meta if isinstance(meta, dict) else None),
            attributes={"gen_ai.operation.name": op, "gen_ai.provider.name": "fastmode",
                        "gen_ai.request.model": str(model)})
        events = self._generate(request, span)
        lane, outcome = None, "cancelled"
        try:
            async for event in events:
                if span.is_recording():
                    _record(span, event)
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

    async def _generate(self, request: dict[str, Any], span) -> AsyncIterator[dict[str, Any]]:
        arrived = time.perf_counter()
        rid = request.get("id") if isinstance(request, dict) and isinstance(request.get("id"), str) else None
        lane = None
        try:
            req = GenerateRequest.parse(request)
            rid = req.id or f"resp_{uuid.uuid4().hex}"
            lane_request = {"prompt": req.prompt, "max_tokens": req.max_output_tokens,
                            "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed,
                            "stop": req.stop_list, "ignore_eos": req.ignore_eos, "request_id": rid,
                            "trace": telemetry.inject(span) if span.is_recording() else None}
            lane, route = await self.pick(req)
            lane = self.admit(lane, req, route)
        except Exception as e:  # noqa: BLE001 - every failure becomes the stream's one error event
            yield to_event(e, rid)
            return
        stream, first, finished = None, None, False
        try:
            stream = self.handles[lane].options(stream=True).generate.remote(lane_request)
            async for event in stream:
                if event["type"] == "accepted":  # the lane took it: only now announce the response
                    yield {"type": "created", "id": rid, "lane": lane, "model": self.ids[lane],
                           "input_tokens": event["input_tokens"], "route": route}
                    continue
                event["id"] = rid
                if event["type"] == "delta" and first is None:
                    first = time.perf_counter()
                elif event["type"] == "done":
                    event["timing"]["engine_ttft_s"] = event["timing"]["ttft_s"]
                    event["timing"]["ttft_s"] = None if first is None else first - arrived
                    event["timing"]["total_s"] = time.perf_counter() - arrived
                    event["route"] = route
                    finished = True
                yield event
        except Exception as e:  # noqa: BLE001
            finished = True
            yield to_event(e, rid)
        finally:
            self.in_flight[lane] -= 1
            if stream is not None and not finished:  # the caller went away: stop the lane's stream (and its engine sequence)
                stream.cancel()

    def models(self) -> list[dict[str, Any]]:
        """The served model ids and the lanes behind each."""
        m = self.config.models
        return [{"id": m.full.id, "lanes": [STANDARD, PRIORITY], "path": m.full.path},
                {"id": m.fast.id, "lanes": [FAST], "path": m.fast.path},
                {"id": AUTO, "lanes": [FAST, STANDARD, PRIORITY], "path": None}]

    async def stats(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Each lane's load (from one of its replicas) and this router's in-flight counts.

        A lane whose replica does not answer within ``timeout_s`` shows ``ready: false``.
        """
        async def one(name: str) -> dict[str, Any]:
            try:
                s = await asyncio.wait_for(self.handles[name].stats.remote(), timeout_s)
                return {"ready": True, **s}
            except Exception as e:  # noqa: BLE001
                return {"ready": False, "error": f"{type(e).__name__}: {e}"}

        lanes = dict(zip(LANES, await asyncio.gather(*(one(n) for n in LANES)), strict=True))
        for name in LANES:
            lanes[name]["router_in_flight"] = self.in_flight[name]
        return {"status": "ok" if all(v["ready"] for v in lanes.values()) else "degraded", "lanes": lanes}


def _record(span, event: dict[str, Any]) -> None:
    """Put what ``event`` tells about the request on its span."""
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
        span.set_status(Status(StatusCode.ERROR, event["message"][:200]))
