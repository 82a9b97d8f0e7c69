"""``Gateway``: the application's HTTP ingress (FastAPI on Serve's HTTP proxy, one port).

Routes today: ``GET /health`` (200 when every lane's engine answers, else 503, with per-lane
detail), ``GET /v1/models``, and ``POST /v1/generate``, which streams the router's events as
newline-delimited JSON (one event per line; the request body is a ``serve.request.GenerateRequest``).
The persistent WebSocket and the OpenAI-compatible routes are added here (issue 5).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from .errors import InvalidRequest, to_event

api = FastAPI(title="fastmode", docs_url=None, redoc_url=None)


def _error(event: dict[str, Any]) -> JSONResponse:
    headers = {"Retry-After": str(max(1, round(event["retry_after"])))} if "retry_after" in event else None
    return JSONResponse(event, status_code=event["status"], headers=headers)


@serve.ingress(api)
class Gateway:
    """HTTP front door over the router's handle."""

    def __init__(self, router) -> None:
        self.router = router

    @api.get("/health")
    async def health(self) -> JSONResponse:
        stats = await self.router.stats.remote()
        return JSONResponse(stats, status_code=200 if stats["status"] == "ok" else 503)

    @api.get("/v1/models")
    async def list_models(self) -> dict[str, Any]:
        models = await self.router.models.remote()
        return {"object": "list", "data": [{"id": m["id"], "object": "model", "owned_by": "fastmode",
                                            "lanes": m["lanes"]} for m in models]}

    @api.post("/v1/generate")
    async def generate(self, request: Request) -> StreamingResponse:
        try:
            body = await request.json()
        except ValueError as e:
            return _error(to_event(InvalidRequest(f"the body is not JSON: {e}")))
        stream = self.router.options(stream=True).generate.remote(body)
        try:
            first = await stream.__anext__()
        except Exception as e:  # noqa: BLE001 - the router failed outright: still a typed answer
            return _error(to_event(e))
        if first["type"] == "error":  # refused before anything streamed: a plain HTTP error
            return _error(first)

        async def lines():
            try:
                yield json.dumps(first) + "\n"
                async for event in stream:
                    yield json.dumps(event) + "\n"
            except Exception as e:  # noqa: BLE001 - mid-stream failure: the stream's last line says so
                yield json.dumps(to_event(e, first.get("id"))) + "\n"
            finally:
                stream.cancel()  # a client that hung up: free the engine sequence

        return StreamingResponse(lines(), media_type="application/x-ndjson")

