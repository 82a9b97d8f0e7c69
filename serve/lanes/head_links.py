"""Head links: a front door streams the fast lane from its ring's head chip, not through the replica.

Why: through its replica, a first token on the fast lane crosses three processes after the front
door (the lane replica, the head chip, and back through the replica), each a wake-up of a
sleeping core plus its Python. The ring's head takes requests from several clients at once
(``sharding.ring.Head``), so each front door runs the fast lane's own request path itself (a
``Lane`` around a ``HeadClient``: tokenize, check the budget, coalesce, detokenize, the ``done``
event with usage, cost and hops, metrics and spans) and talks to the head directly:

    before:  front door ═ lane replica ─ head chip ─ ... ─ head chip ─ lane replica ═ front door
    after:   front door ─ head chip ─ ... ─ head chip ─ front door

The lane replica still builds, owns, health-checks and rebuilds the ring, warms it up, and
serves whatever comes through its link or Serve's handle; it hands out the head's address and
secret with its link's (``Lane.link_address``), over Ray's authenticated handle call. When the
ring fails, the head link's streams end with ``lane_unavailable`` (as they would through the
replica), the replica rebuilds the ring, and the router opens a link to the new head at its next
discovery; meanwhile requests go through the replica's link.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from sharding.config import ModelConfig

from ..config import TelemetryConfig
from .head_client import HeadClient
from .lane import FAST, Lane
from .lane_links import _picklable


class HeadConn:
    """A front door's own fast lane on one replica's ring: ``start(request)`` streams a
    ``LaneRequest``'s events as the replica's link would (the interface of
    ``serve.lanes.lane_links.LinkStream``).

    Args:
        replica: the lane replica that owns the ring.
        lane: a ``Lane`` whose engine is a ``HeadClient`` of that ring.
    """

    def __init__(self, replica: str, lane: Lane) -> None:
        self.replica, self.lane = replica, lane
        self.streams: dict[int, HeadStream] = {}
        self._next = 0

    @classmethod
    async def open(cls, replica: str, head: dict[str, Any], model_id: str, model_path: str | Path,
                   config: dict[str, Any], telemetry_config: dict[str, Any] | None = None,
                   chat_template: str | None = None, chat_template_kwargs: dict[str, Any] | None = None) -> HeadConn:
        """Connect to the head ``head`` (from ``Lane.link_address``) and build the lane around it
        (``chat_template``, ``chat_template_kwargs``: the fast model's, as ``Lane`` takes them)."""
        def build() -> Lane:
            tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
            engine = HeadClient(ModelConfig.from_pretrained(model_path), head["max_len"],
                                (head["host"], head["port"]), head["secret"], tokenizer, head["layout"],
                                TelemetryConfig.model_validate(telemetry_config or {}))
            return Lane(FAST, model_id, str(model_path), config, telemetry_config, engine=engine,
                        chat_template=chat_template, chat_template_kwargs=chat_template_kwargs)

        lane = await asyncio.to_thread(build)
        await lane.engine.connect()
        return cls(replica, lane)

    @property
    def alive(self) -> bool:
        return self.lane.engine.failure() is None

    def start(self, request: Any) -> HeadStream:
        self._next += 1
        stream = self.streams[self._next] = HeadStream(self, self._next, self.lane.generate(request))
        return stream

    def close(self) -> None:
        """Close the link to the head: every open stream ends with ``lane_unavailable``."""
        self.lane.engine.close()


class HeadStream:
    """One request's events from a front door's own fast lane: the ``Lane``'s generator, iterated by
    the caller's task itself (no task or queue in between: each is a loop turn on the way to the first
    token). ``__anext__`` raises the lane's typed exception; ``cancel()`` closes the generator, which
    aborts the sequence at the head."""

    def __init__(self, conn: HeadConn, cid: int, events: AsyncIterator[dict[str, Any]]) -> None:
        self._conn, self._cid, self._events = conn, cid, events
        self._ended = False
        self._closing: asyncio.Future | None = None

    def __aiter__(self) -> HeadStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._ended:
            raise StopAsyncIteration
        try:
            event = await self._events.__anext__()
            if event.get("type") == "done":  # the caller stops here: run the lane's cleanup now
                self._end()
                await self._events.aclose()
            return event
        except BaseException as e:  # its end, its typed error, or cancelled while it waited
            self._end()
            if isinstance(e, Exception) and not isinstance(e, StopAsyncIteration):
                raise _picklable(e) from e
            raise

    def _end(self) -> None:
        self._ended = True
        self._conn.streams.pop(self._cid, None)

    def cancel(self) -> None:
        """Stop the stream (idempotent): the lane's cleanup runs, and the head frees the sequence."""
        if not self._ended:
            self._end()
        if self._closing is None and not self._events.ag_running:
            self._closing = asyncio.ensure_future(self._events.aclose())
