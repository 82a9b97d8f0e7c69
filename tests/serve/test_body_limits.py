"""``serve.body_limits.BodyLimits``: the body limits behind Ray Serve's proxy (``http.server: serve``),
on an app of its own driven by httpx's ASGI transport (the gateway's own server has them in
``serve.listen``: ``tests/serve/test_listen.py``)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI, Request

from serve.body_limits import BodyLimits

LIMIT = 1000


def app(limits=(0.5, LIMIT)) -> tuple[FastAPI, list[int]]:
    api = FastAPI()
    seen: list[int] = []

    @api.post("/echo")
    async def echo(request: Request):
        body = await request.body()
        seen.append(len(body))
        return {"bytes": len(body)}

    @api.middleware("http")  # as the gateway's key check: Starlette then raises from a task group
    async def passthrough(request: Request, call_next):
        return await call_next(request)

    api.add_middleware(BodyLimits, limits=lambda scope: limits)
    return api, seen


def post(api, content, headers=None) -> httpx.Response:
    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://t") as client:
            return await client.post("/echo", content=content, headers=headers)

    return asyncio.run(main())


def chunks(*parts: bytes, pause_s: float = 0.0):
    async def gen():
        for i, part in enumerate(parts):
            if i:
                await asyncio.sleep(pause_s)
            yield part

    return gen()


def test_a_body_within_the_limits_reaches_the_route():
    api, seen = app()
    r = post(api, b"x" * LIMIT)
    assert r.status_code == 200 and r.json() == {"bytes": LIMIT} and seen == [LIMIT]
    r = post(api, chunks(b"a" * 400, b"b" * 400, pause_s=0.05))
    assert r.status_code == 200 and r.json() == {"bytes": 800}


@pytest.mark.parametrize("how", ["declared", "streamed"])
def test_a_body_over_the_cap_is_413_and_the_route_answers_nothing(how):
    api, seen = app()
    content = b"x" * (LIMIT + 1) if how == "declared" else chunks(b"x" * 600, b"y" * 600)
    r = post(api, content)
    assert r.status_code == 413 and r.json()["error"]["code"] == "invalid_request"
    assert "over the limit of 1000 bytes" in r.json()["error"]["message"] and r.headers["connection"] == "close"
    assert seen == []


def test_a_body_slower_than_the_timeout_is_408():
    api, seen = app()
    r = post(api, chunks(b"a", b"b", pause_s=1.0))
    assert r.status_code == 408 and "did not arrive within 0.5 s" in r.json()["error"]["message"] and seen == []


def test_a_bad_content_length_is_400_and_no_limits_means_untouched():
    api, _ = app()
    assert post(api, b"x", headers={"content-length": "-1"}).status_code == 400
    api, seen = app(limits=None)  # the gateway's own server applies them: the middleware steps aside
    r = post(api, b"x" * (LIMIT * 3))
    assert r.status_code == 200 and seen == [LIMIT * 3]
