"""The blocking client: the same methods as ``AsyncClient``, run on an event loop in a background
thread (the logic lives in ``client.py`` only)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from typing import Any

from .client import DEFAULT_BASE_URL, AsyncClient, Response, ResponseStream


class Stream:
    """One response as it streams (blocking). Iterate it for text deltas; afterwards ``result``
    (or ``final()``) is the ``Response``. Leaving the loop early, leaving ``with``, or ``cancel()``
    cancels the response on the server."""

    def __init__(self, client: Client, stream: ResponseStream) -> None:
        self._client, self._stream = client, stream

    id = property(lambda self: self._stream.id, doc="The response id.")
    lane = property(lambda self: self._stream.lane, doc="The lane serving it.")
    model = property(lambda self: self._stream.model, doc="The model serving it.")
    route = property(lambda self: self._stream.route, doc="How the router chose the lane.")
    text = property(lambda self: self._stream.text, doc="The text received so far.")
    done = property(lambda self: self._stream.done, doc="Whether the response has ended.")
    result = property(lambda self: self._stream.result, doc="The finished Response (None until then).")
    error = property(lambda self: self._stream.error, doc="The error it ended with, if any.")

    def __iter__(self) -> Iterator[str]:
        try:
            while (text := self._client._run(self._stream._next_text())) is not None:
                yield text
        finally:
            if not self._stream.done:
                self.cancel()

    def cancel(self, timeout_s: float = 10.0) -> None:
        """Cancel the response and wait for the server to confirm it."""
        self._client._run(self._stream.cancel(timeout_s))

    def final(self) -> Response:
        """Read the rest of the response and return it (raises the error it ended with)."""
        return self._client._run(self._stream.final())

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        if not self._stream.done:
            self.cancel()


class Responses:
    """``client.responses``: start responses (blocking)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def stream(self, **params: Any) -> Stream:
        """Start a response and stream it; the parameters of ``AsyncResponses.stream``."""
        opener = self._client._async.responses.stream(**params)
        return Stream(self._client, self._client._run(opener.open()))

    def create(self, **params: Any) -> Response:
        """Run a response to its end and return it; the parameters of ``AsyncResponses.stream``."""
        return self._client._run(self._client._async.responses.create(**params))


class Client:
    """The blocking fastmode client; the arguments of ``AsyncClient``. Use it as a context manager
    or call ``close()``."""

    def __init__(self, base_url: str = DEFAULT_BASE_URL, api_key: str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fastmode-sdk", daemon=True)
        self._thread.start()
        self._async = self._run(_make(base_url, api_key, options))
        self.url = self._async.url
        self.responses = Responses(self)

    def _run(self, coro):
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:  # e.g. KeyboardInterrupt in the calling thread: stop the coroutine too
            if not future.done():
                future.cancel()
                try:
                    future.result(5)
                except (concurrent.futures.CancelledError, concurrent.futures.TimeoutError, Exception):
                    pass
            raise

    def close(self) -> None:
        """Close the connection and stop the background thread."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._async.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _make(base_url: str, api_key: str | None, options: dict[str, Any]) -> AsyncClient:
    return AsyncClient(base_url, api_key, **options)
