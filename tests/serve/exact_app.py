"""``exact_lane_app``: the front doors' own code in process over a real exact lane, for
``test_chat_app.py`` and ``test_sampling.py``.

The ``openai`` package over HTTP (chat completions, completions, Responses) and the WebSocket
protocol reach the ``Router``; its exact lane is a ``Lane`` with fastmode's speculative engine (the
full model drafted by the fast one, eager), its engine wrapped in a ``Spy`` that keeps every
``EngineRequest``; the other lanes are recording stand-ins (``test_chat_prompts.Recording``). Not a
``fastmode up`` app (minutes to start)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
from fastapi import FastAPI, Request, WebSocket
from fastapi.testclient import TestClient


class Spy:
    """A lane's engine that keeps each ``EngineRequest`` it is given."""

    def __init__(self, engine) -> None:
        self.inner, self.requests = engine, []

    def generate(self, request):
        self.requests.append(request)
        return self.inner.generate(request)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class InProcess:
    """A lane handle (``handle.options(stream=True).generate.remote(request)``) over a ``Lane`` here."""

    def __init__(self, lane) -> None:
        self.lane = lane

    def options(self, stream: bool):
        return self

    @property
    def generate(self):
        return self

    def remote(self, request):
        return _Stream(self.lane.generate(request))


class _Stream:
    def __init__(self, events) -> None:
        self.events = events

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self.events.__anext__()

    def cancel(self) -> None:
        asyncio.ensure_future(self.events.aclose())


@contextmanager
def exact_lane_app(full: Path, fast: Path, name: str) -> Iterator[dict[str, Any]]:
    """The front doors over a real exact lane on ``full`` drafted by ``fast``, serving them as
    ``{name}-full`` and ``{name}-fast``: ``{"client": openai.OpenAI, "http": TestClient (its
    ``websocket_connect("/v1/responses")`` too), "spy": the exact lane's Spy, "full": full}``."""
    from serve.config import load_config
    from serve.gateway import api as _  # noqa: F401 - the gateway's imports, as a front door has them
    from serve.lanes.lane import EXACT, Lane
    from serve.openai_api import chat_completions, completions
    from serve.openai_responses import create
    from serve.router import Router
    from serve.websocket import Session
    from tests.serve.test_chat_prompts import Recording

    full_id, fast_id = f"{name}-full", f"{name}-fast"
    config = load_config({"models": {"full": {"id": full_id, "path": str(full)},
                                     "fast": {"id": fast_id, "path": str(fast)}},
                          "router": {"lane_links": False}, "lanes": {"exact": {"compile": False}}})
    exact = Lane(EXACT, full_id, str(full), config.lanes.exact.model_dump(mode="json"), draft_path=str(fast))
    exact.engine = Spy(exact.engine)
    try:
        others = {lane: Lane(lane, fast_id if lane == "fast" else full_id, str(fast if lane == "fast" else full), {},
                             engine=Recording()) for lane in ("fast", "priority", "standard")}
        router = Router(config, **{lane: InProcess(handle) for lane, handle in others.items()}, exact=InProcess(exact))
        api = FastAPI()

        @api.post("/v1/chat/completions")
        async def _chat(request: Request):
            return await chat_completions(router, request)

        @api.post("/v1/completions")
        async def _completions(request: Request):
            return await completions(router, request)

        @api.post("/v1/responses")
        async def _responses(request: Request):
            return await create(router, request)

        @api.websocket("/v1/responses")
        async def _ws(ws: WebSocket):
            await ws.accept()
            await Session(ws, router, config.gateway).run()

        with TestClient(api) as http:
            client = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=http, max_retries=0)
            yield {"client": client, "http": http, "spy": exact.engine, "full": full}
    finally:
        exact.engine.inner.shutdown()
