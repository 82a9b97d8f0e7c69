"""Head links: a front door streams the fast lane from its ring's head chip, not through the replica.

Why: a first token on the fast lane crossed three processes after the front door (the lane
replica, the head chip, and back through the replica), each a wake-up of a sleeping core on a VM
plus its Python. The ring's head takes requests from several clients at once
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
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from sharding.config import ModelConfig

from ..config import TelemetryConfig
from .head_client import HeadClient
from .lane import FAST, Lane
from .link import LinkStream, _picklable


class HeadConn:
    """A front door's own fast lane on one replica's ring: ``start(request)`` streams a
    ``LaneRequest``'s events as the replica's link would (``serve.lanes.link.LinkStream``).

    Args:
        replica: the lane replica that owns the ring.
        lane: a ``Lane`` whose engine is a ``HeadClient`` of that ring.
    """

    def __init__(self, replica: str, lane: Lane) -> None:
        self.replica, self.lane = replica, lane
        self.streams: dict[int, LinkStream] = {}
        self._tasks: dict[int, asyncio.Task] = {}
        self._next = 0

    @classmethod
    async def open(cls, replica: str, head: dict[str, Any], model_id: str, model_path: str | Path,
                   config: dict[str, Any], telemetry_config: dict[str, Any] | None = None) -> HeadConn:
        """Connect to the head ``head`` (from ``Lane.link_address``) and build the lane around it."""
        def build() -> Lane:
            tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
            engine = HeadClient(ModelConfig.from_pretrained(model_path), head["max_len"],
                                (head["host"], head["port"]), head["secret"], tokenizer, head["layout"],
                                TelemetryConfig.model_validate(telemetry_config or {}))
            return Lane(FAST, model_id, str(model_path), config, telemetry_config, engine=engine)

        lane = await asyncio.to_thread(build)
        await lane.engine.connect()
        return cls(replica, lane)

    @property
    def alive(self) -> bool:
        return self.lane.engine.failure() is None

    def start(self, request: Any) -> LinkStream:
        self._next += 1
        cid = self._next
        stream = self.streams[cid] = LinkStream(self, cid)
        self._tasks[cid] = asyncio.create_task(self._pump(cid, stream, request))
        return stream

    async def _pump(self, cid: int, stream: LinkStream, request: Any) -> None:
        events = self.lane.generate(request)
        try:
            async for event in events:
                stream._queue.put_nowait(event)
            stream._queue.put_nowait(None)
        except Exception as e:  # noqa: BLE001 - the stream's typed end, raised to its reader
            stream._queue.put_nowait(_picklable(e))
        finally:
            self._tasks.pop(cid, None)
            await events.aclose()

    def cancel(self, cid: int) -> None:
        """The caller went away: end the stream here (the head frees the sequence at its next step)."""
        self.streams.pop(cid, None)
        task = self._tasks.pop(cid, None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self.lane.engine.close()
