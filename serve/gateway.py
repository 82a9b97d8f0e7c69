"""``Gateway``: the application's front door on one HTTP port (FastAPI).

Who listens on the port is ``http.server``: ``gateway`` (the default) serves the FastAPI app from
the gateway replica itself (``serve.listen``), so a chunk goes lane replica -> gateway -> client;
``serve`` leaves it to Ray Serve's HTTP proxy (what ``serve deploy`` clusters and KubeRay's
Service expect), which forwards each request and each streamed chunk to this replica.

- ``GET /health``: 200 when every lane is warm and its engine answers, else 503 (``status``
  ``starting`` while lanes warm up, ``degraded`` after), with per-lane detail (no key needed, for
  load balancers);
- ``GET /playground/``: a page that races the lanes over the WebSocket (static files from
  ``serve/playground``, no key needed: the WebSocket it opens asks for one); ``GET /`` redirects there;
- ``WS /v1/responses``: the persistent WebSocket (``serve.websocket``, ``docs/protocol.md``);
- ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``: OpenAI-compatible
  (``serve.openai_api``); ``POST /v1/responses``: OpenAI's Responses API over HTTP, with
  ``previous_response_id`` (``serve.openai_responses``);
- ``POST /v1/generate``: the router's events as newline-delimited JSON (one event per line);
- ``GET /v1/door``: the URL of the fast lane's own WebSocket, which its ring's head chip serves in
  its loop (``serve.lanes.door``), for clients that want the fast model's first token without
  this process on the way.

With API keys configured (``serve.auth``), every route but ``/health`` and the playground's files
needs ``Authorization: Bearer KEY``: 401 on HTTP, close code 1008 on the WebSocket (where a browser
may send the key as a subprotocol instead, ``serve.auth.KEY_SUBPROTOCOL``). A key may hold
``gateway.max_connections_per_key`` WebSockets on this replica; one more is told so
(``too_many_connections``) and closed with 1008, which a browser can see, unlike the status of a
refused upgrade. Request bodies are parsed by ``serve.errors.parse_json``, so that JSON Python's
parser gives up on is a 400 too, not a 500. With ``http.tls_certfile`` and ``http.tls_keyfile`` the
port speaks https and wss only (whichever ``http.server`` listens: uvicorn here, or Ray Serve's
proxy, ``serve.up.serve_config``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from ray import serve

from sharding import cpus

from . import openai_api, openai_responses, telemetry
from .auth import insecure_warning, key_of, load_keys, owner_of, subprotocol_bearer
from .body_limits import BodyLimits
from .config import load_config
from .errors import InvalidRequest, NotReady, first_event, parse_json, to_event
from .listen import listen
from .openai_api import ClosingStream, JSONBody
from .protocol import VERSION
from .router import Router
from .websocket import CLOSE_POLICY, Session

log = logging.getLogger(__name__)
api = FastAPI(title="fastmode", docs_url=None, redoc_url=None)
PLAYGROUND = "/playground"
api.mount(PLAYGROUND, StaticFiles(directory=Path(__file__).parent / "playground", html=True), name="playground")
PUBLIC = ("/health", "/", PLAYGROUND)
"""Paths served without a key (the playground's files below ``PLAYGROUND`` too)."""


def _public(path: str) -> bool:
    return path in PUBLIC or path.startswith(PLAYGROUND + "/")


def _error(event: dict[str, Any]) -> JSONBody:
    headers = {"Retry-After": str(max(1, round(event["retry_after"])))} if "retry_after" in event else None
    return JSONBody(event, status_code=event["status"], headers=headers)


@api.middleware("http")
async def _require_key(request: Request, call_next):
    gateway = request.app.state.gateway
    if _public(request.url.path):
        return await call_next(request)
    key = key_of(gateway.keys, request.headers.get("authorization"))
    if key is None:
        return JSONResponse({"error": {"message": "missing or wrong API key (Authorization: Bearer KEY)",
                                       "type": "authentication_error", "code": "unauthorized"}},
                            status_code=401, headers={"WWW-Authenticate": "Bearer"})
    request.state.owner = owner_of(key)  # whose stored responses this request may continue
    return await call_next(request)


def _body_limits(scope: dict[str, Any]) -> tuple[float, int] | None:
    """``gateway.body_timeout_s`` and ``max_body_bytes`` behind Ray Serve's proxy; none with the gateway's
    own server, which applies them before the app (``serve.listen``)."""
    config = scope["app"].state.gateway.config
    return None if config.http.server == "gateway" else (config.gateway.body_timeout_s, config.gateway.max_body_bytes)


api.add_middleware(BodyLimits, limits=_body_limits)  # outermost: a refused body never reaches the key check


@serve.ingress(api)
class Gateway:
    """HTTP and WebSocket front door; its ``Router`` streams from the lanes' replicas directly.

    Args:
        config: the validated deployment config (as a dict).
        fast, priority, standard, exact: the lane deployments' handles.
        grpc_server: the gRPC server deployment's handle, if enabled.
        stored: the ``StoredResponses`` deployment's handle (``store: true`` responses).
    """

    async def __init__(self, config: dict[str, Any], fast, priority, standard, exact, grpc_server=None,
                       stored=None) -> None:
        telemetry.setup("gateway")
        self.config = load_config(config)
        cpus.place("serving", self.config.cpus)
        self.grpc_server = grpc_server  # held so that Serve deploys it with the application
        self.keys = load_keys(self.config)  # refuses a non-loopback bind without keys
        if warning := insecure_warning(self.config, self.keys):
            log.warning(warning)
        self.connections: Counter[str] = Counter()
        """Open WebSocket connections per API key (``gateway.max_connections_per_key``)."""
        self.router = Router(self.config, fast, priority, standard, exact, stored)
        self.router.start_warmup()  # /health and /v1/models say ready once every lane is warm
        api.state.gateway = self
        self.server = self.serving = None
        if self.config.http.server == "gateway":
            http = self.config.http
            g = self.config.gateway
            self.server, self.serving = await listen(
                api, http.host, http.port, ws_max_size=2 * g.max_frame_bytes, header_timeout_s=g.header_timeout_s,
                max_header_bytes=g.max_header_bytes, body_timeout_s=g.body_timeout_s, max_body_bytes=g.max_body_bytes,
                tls_certfile=http.tls_certfile, tls_keyfile=http.tls_keyfile)

    async def wait_ready(self, timeout_s: float = 600.0) -> bool:
        """Wait until this gateway's router has warmed every lane (``fastmode up`` calls it before
        printing its URLs); ``False`` if that takes longer than ``timeout_s``."""
        try:
            await asyncio.wait_for(asyncio.shield(self.router.start_warmup()), timeout_s)
        except TimeoutError:
            return False
        return True

    async def check_health(self) -> None:
        """Serve's health check: the replica is replaced if its own HTTP server has stopped."""
        if self.serving is not None and self.serving.done():
            raise RuntimeError(f"the gateway's HTTP server stopped: {self.serving.exception()!r}")

    async def __del__(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.serving, 5)

    @api.get("/health")
    async def health(self) -> JSONResponse:
        stats = await self.router.stats()
        stats["websocket_connections"] = sum(self.connections.values())  # open on this replica
        return JSONResponse(stats, status_code=200 if stats["status"] == "ok" else 503)

    @api.get("/")
    async def index(self) -> RedirectResponse:
        return RedirectResponse(PLAYGROUND + "/")

    @api.websocket("/v1/responses")
    async def responses(self, ws: WebSocket) -> None:
        offered = ws.scope.get("subprotocols") or []
        # A browser that offered subprotocols fails the handshake unless one is selected.
        await ws.accept(subprotocol=VERSION if VERSION in offered else None)
        key = key_of(self.keys, ws.headers.get("authorization") or subprotocol_bearer(offered))
        if key is None:
            await ws.close(CLOSE_POLICY, reason="missing or wrong API key")
            return
        # Over the limit: accepted, then told why and closed (a browser sees a close code and reason, never
        # the status of a refused upgrade).
        limit = self.config.gateway.max_connections_per_key
        if self.connections[key] >= limit:
            await ws.send_text(json.dumps({"type": "error", "id": None, "code": "too_many_connections",
                                           "message": f"this API key holds {limit} connections to this gateway "
                                           "replica, its limit; close one, or use one for many responses"}))
            await ws.close(CLOSE_POLICY, reason=f"too many connections for this API key (limit {limit})")
            return
        self.connections[key] += 1
        try:
            await Session(ws, self.router, self.config.gateway, owner_of(key)).run()
        finally:
            self.connections[key] -= 1
            if not self.connections[key]:
                del self.connections[key]

    @api.get("/v1/door")
    async def door(self) -> JSONResponse:
        """Where the fast lane's own WebSocket is (``serve.lanes.door``): the fast model's requests
        there skip this process. 404 ``door_unavailable`` when the config has none, or its ring is
        being rebuilt (ask again after ``retry_after``)."""
        doors = await self.router.doors() if self.config.door_on() else []
        if not doors:
            why = ("the fast lane serves no door (lanes.fast.door is false, or http has TLS)"
                   if not self.config.door_on() else "the fast lane's ring is starting or being rebuilt")
            event = {"type": "error", "id": None, "code": "door_unavailable", "message": why, "status": 404}
            if self.config.door_on():
                event["retry_after"] = 5
            return _error(event)
        return JSONResponse({"object": "list", "data": doors})

    @api.get("/v1/models")
    async def list_models(self) -> JSONResponse:
        if not self.router.ready:  # a client's first probe: answer once every lane serves at full speed
            return _error(to_event(NotReady("the lanes are still starting (see /health)", retry_after=5)))
        return await openai_api.list_models(self.router)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await openai_api.chat_completions(self.router, request)

    @api.post("/v1/completions")
    async def completions(self, request: Request):
        return await openai_api.completions(self.router, request)

    @api.post("/v1/responses")
    async def create_response(self, request: Request):
        return await openai_responses.create(self.router, request)

    @api.post("/v1/generate")
    async def generate(self, request: Request):
        try:
            body = parse_json(await request.body())
        except InvalidRequest as e:
            return _error(to_event(e))
        body = telemetry.with_traceparent(body, request.headers)
        stream = self.router.stream(body, owner=request.state.owner)
        first = await first_event(stream)
        if first["type"] == "error":  # refused before anything streamed: a plain HTTP error
            return _error(first)

        async def lines():
            try:
                yield json.dumps(first) + "\n"
                async for event in stream:
                    yield json.dumps(event) + "\n"
            except Exception as e:  # noqa: BLE001 - mid-stream failure: the stream's last line says so
                yield json.dumps(to_event(e, first.get("id"))) + "\n"

        # However it ends, a client that hung up included: free the engine sequence.
        return ClosingStream(lines(), on_close=stream.cancel, media_type="application/x-ndjson")
