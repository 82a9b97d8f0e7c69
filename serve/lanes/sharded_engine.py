"""``ShardedLaneEngine``: fastmode's own executor (``sharding``) behind the ``LaneEngine`` interface.

The fast model runs on a ring of chips (``sharding.pipeline.ShardedModel``) that decodes by
itself: this replica sends each request and abort to the ring's head chip, and one reader task on
the event loop reads what the head sends back (every few steps, a request's first token and its
end at once: ``sharding.ring.FLUSH_S``) and hands each request its tokens. Nothing per token
crosses a thread or a Ray call here; the per-token work in this process is detokenizing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import torch
from tokenizers import Tokenizer

from sharding.pipeline import RingFailed, ShardedModel
from sharding.placement import CHIP
from sharding.planner import AUTO, auto_layout
from sharding.ring import StepInfo, step_infos
from sharding.transport import LinkClosed, frame, read_frame

from .. import metrics
from ..config import FastLaneConfig, TelemetryConfig
from ..errors import LaneUnavailable
from .engine import EngineOutput, EngineRequest
from .step_spans import HopTotals, StepSpans
from .text import TextStream


def cluster_chips() -> int:
    """Chips the Ray cluster offers (its ``chip`` resource, every node together); without Ray yet,
    the local one ``ShardedModel`` would start: this machine's cores."""
    import ray

    if not ray.is_initialized():
        return os.cpu_count() or 1
    return int(ray.cluster_resources().get(CHIP, 0))


def resolve_layout(path: str | Path, config: FastLaneConfig, chips: int) -> tuple[int, int, str]:
    """``(tp, pp, why)`` the lane deploys: the config's, or where it says ``auto`` the planner's pick
    on ``chips / replicas`` chips (``sharding.planner.auto_layout``)."""
    if AUTO not in (config.tp, config.pp):
        return config.tp, config.pp, "set in the config"
    n = chips // config.replicas
    best, _ = auto_layout(path, chips=n, device=config.device, tp=config.tp, pp=config.pp, dtype=config.dtype)
    return best.tp, best.pp, f"auto: the planner's pick on {n} chip(s), see fastmode plan"


class ShardedLaneEngine:
    """The fast model, ``tp x pp`` over chips that decode in a ring.

    Args:
        path: the checkpoint directory.
        config: the fast lane's section of the deployment config.
        tokenizer: the checkpoint's tokenizer (for detokenization and stop strings).
        telemetry: step-span sampling (``TelemetryConfig``).
    """

    def __init__(self, path: str | Path, config: FastLaneConfig, tokenizer: Tokenizer,
                 telemetry: TelemetryConfig | None = None) -> None:
        self.telemetry = telemetry or TelemetryConfig()
        self.tp, self.pp, self.layout_reason = resolve_layout(path, config, cluster_chips())
        self.layout = {"fastmode.tp": self.tp, "fastmode.pp": self.pp, "fastmode.transport": config.transport}
        self.model = ShardedModel.from_pretrained(
            path, tp=self.tp, pp=self.pp, num_slots=config.num_slots, max_len=config.max_len,
            dtype=getattr(torch, config.dtype), device=config.device, compile=config.compile,
            threads_per_chip=config.threads_per_chip, spin_s=config.spin_us / 1e6, prefix_cache=config.prefix_cache,
            packed_weights=config.packed_weights)
        try:
            self.model.warmup()  # compile now, not on a user's request
            self.model.close_client()  # the warm-up's blocking client; the lane reads asynchronously
        except BaseException:
            self.model.shutdown()
            raise
        self.max_len = self.model.max_len
        self.tokenizer = tokenizer
        self._sinks: dict[str, asyncio.Queue] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._connecting: asyncio.Lock | None = None
        self._error: BaseException | None = None
        self._steps = 0

    # -- the link to the head ------------------------------------------------------------------
    async def _connect(self) -> asyncio.StreamWriter:
        if self._writer is not None:
            return self._writer
        self._connecting = self._connecting or asyncio.Lock()
        async with self._connecting:
            if self._writer is None:
                reader, writer = await asyncio.open_connection(*self.model.client_address)
                writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._reader_task = asyncio.create_task(self._read(reader))
                self._writer = writer
        return self._writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                msg = await read_frame(reader)
                if msg[0] == "out":
                    self._deliver(msg[1], step_infos(msg[2]))
                elif msg[0] == "error":
                    sink = self._sinks.get(msg[1])
                    if sink is not None:
                        sink.put_nowait(msg[2])
                elif msg[0] == "fatal":
                    raise RingFailed(f"the ring stopped: {msg[1]}")
        except BaseException as e:  # noqa: BLE001 - reported to every waiting request and to health checks
            self._error = e if not isinstance(e, LinkClosed) else RingFailed(f"the link to the ring closed: {e}")
            for rid in list(self._sinks):
                self._sinks[rid].put_nowait(LaneUnavailable(f"the fast lane's engine failed: {self._error}"))

    def _deliver(self, outputs: list[tuple], infos: list[StepInfo]) -> None:
        per: dict[str, list] = defaultdict(list)
        for rid, token, finished, reason, cached in outputs:
            per[rid].append((token, finished, reason, cached))
        for rid, outs in per.items():
            sink = self._sinks.get(rid)
            if sink is not None:
                sink.put_nowait((outs, infos))
        for info in infos:
            self._steps += 1
            metrics.batch_size("fast", info.batch_size)
            if self._steps % metrics.HOP_EVERY == 0:
                metrics.hops(info.hops)

    # -- LaneEngine ----------------------------------------------------------------------------
    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """See ``LaneEngine.generate``."""
        if self._error is not None:
            raise LaneUnavailable(f"the fast lane's engine is not running ({self._error})")
        rid = request.request_id
        params = request.sampling()
        self.model.validate(rid, request.prompt_ids, params)  # typed errors before anything is sent
        writer = await self._connect()
        sink: asyncio.Queue = asyncio.Queue()
        self._sinks[rid] = sink
        added_ns = time.time_ns()
        writer.write(frame(("add", rid, request.prompt_ids, params)))
        text = TextStream(self.tokenizer, request.stop)
        spans = None
        if request.trace is not None:
            spans = StepSpans(request.trace, self.telemetry.step_spans_first, self.telemetry.step_spans_every,
                              self.layout)
        hops = HopTotals()
        finished = False
        try:
            while True:
                item = await sink.get()
                if isinstance(item, BaseException):
                    finished = True  # never added, or the engine is gone
                    raise item
                outs, infos = item
                tokens = [t for t, _, _, _ in outs]
                for info in infos[-len(outs):]:  # the steps this request took part in
                    hops.add(info.hops)
                    if spans is not None:
                        spans.step(info)
                first = {}
                if added_ns:  # this request's first output: its prefill step
                    start = infos[-len(outs)].start_ns if len(infos) >= len(outs) else infos[0].start_ns
                    first = {"queue_s": max(0, start - added_ns) / 1e9,
                             "batch_size": infos[-len(outs)].batch_size if len(infos) >= len(outs) else None,
                             "cached_tokens": outs[0][3]}
                    added_ns = 0
                _, done, reason, _ = outs[-1]
                delta = text.push(tokens)
                if text.stopped or done:
                    finished = done
                    if not text.stopped:
                        delta += text.flush()
                    yield EngineOutput(tokens, delta, "stop" if text.stopped else reason, hops=hops.per_pair(),
                                       **first)
                    return
                yield EngineOutput(tokens, delta, **first)
        finally:
            self._sinks.pop(rid, None)
            if not finished and self._writer is not None and self._error is None:
                with contextlib.suppress(Exception):  # closed early, or ended by a stop string: free the slot
                    self._writer.write(frame(("abort", rid)))
            if spans is not None:
                spans.finish(hops)

    async def prefix_stats(self) -> dict[str, int] | None:
        """The head's prefix cache (``ShardedModel.prefix_stats``), without blocking the loop."""
        if not self.model.prefix_cache:
            return None
        return await self.model.head_worker.prefix_stats.remote()

    def failure(self) -> BaseException | None:
        return self._error

    def num_unfinished(self) -> int:
        return len(self._sinks)

    async def check_health(self) -> None:
        if self._error is not None:
            raise LaneUnavailable(f"the fast lane's engine has stopped ({self._error})")
        try:
            await asyncio.to_thread(self.model.check_alive)
        except RingFailed as e:
            self._error = self._error or e
            raise LaneUnavailable(f"the fast lane's engine has stopped ({e})") from e

    def shutdown(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.write(frame(("stop",)))
                self._writer.close()
        self.model.shutdown()
