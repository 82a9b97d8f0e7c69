"""``BodyLimits``: each HTTP request's body within a size and a time, behind any HTTP server.

With ``http.server: gateway`` the gateway's own server refuses a body over ``gateway.max_body_bytes``
or slower than ``gateway.body_timeout_s`` before the app sees it (``serve.listen``). With
``http.server: serve`` Ray Serve's proxy listens instead, and it has no such limits: it forwards the
body to the gateway replica as it arrives. This ASGI middleware applies the same two limits there,
in the app: a ``content-length`` over the cap is refused before any of the body is read, a body
that grows past it is refused as soon as it does, and a body not whole within the timeout (from the
request's start in the app) is refused with 408. The answer is OpenAI's error object, and the route
never runs (or, if it was reading, its read fails and its answer is replaced). Limits of the
request's head (header size, slowloris before the head ends) stay the proxy's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .openai_api import _error_response


class BodyRefused(Exception):
    """A request body over its size or time limit (raised from ``receive`` into the route reading it)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class BodyLimits:
    """ASGI middleware. ``limits()`` gives ``(timeout_s, max_bytes)`` for this request, or ``None`` for
    none (the gateway's own server already applies them)."""

    def __init__(self, app, limits: Callable[[dict[str, Any]], tuple[float, int] | None]) -> None:
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send) -> None:
        limits = self.limits(scope) if scope["type"] == "http" else None
        if limits is None:
            await self.app(scope, receive, send)
            return
        timeout_s, max_bytes = limits
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_bytes):
            status = 413 if declared.isdigit() else 400
            await _answer(scope, receive, send, status, f"content-length {declared.decode(errors='replace')!r} is "
                          f"{'over the limit of' if status == 413 else 'not a size within'} {max_bytes} bytes")
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        size, whole, started = 0, False, False

        async def limited() -> dict[str, Any]:
            nonlocal size, whole
            if whole:  # the body is in: waiting for a disconnect is not limited here
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise BodyRefused(408, f"the request body did not arrive within {timeout_s:g} s") from None
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > max_bytes:
                    raise BodyRefused(413, f"the request body is over the limit of {max_bytes} bytes")
                whole = not message.get("more_body", False)
            return message

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracked)
        except Exception as e:
            refused = _refusal(e)
            if refused is None or started:  # not ours, or too late to answer: the server closes the connection
                raise
            await _answer(scope, receive, send, refused.status, refused.message)


def _refusal(e: BaseException) -> BodyRefused | None:
    """The ``BodyRefused`` that ``e`` is, or carries (Starlette's ``BaseHTTPMiddleware`` raises an
    exception group from its task group)."""
    if isinstance(e, BodyRefused):
        return e
    if isinstance(e, BaseExceptionGroup):
        group = e.subgroup(BodyRefused)
        while group is not None and not isinstance(group, BodyRefused):
            group = group.exceptions[0]
        return group
    return None


async def _answer(scope, receive, send, status: int, message: str) -> None:
    """OpenAI's error object with ``status``, and the connection closed after it."""
    response = _error_response(status, message, "invalid_request")
    response.headers["connection"] = "close"
    await response(scope, receive, send)
