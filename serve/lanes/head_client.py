"""``HeadClient``: a ``LaneEngine`` that streams from a running ring's head chip over TCP.

The fast model's ring (``sharding.pipeline.ShardedModel``) decodes by itself; its head chip takes
requests from several clients at once (``sharding.ring.Head``). This is one such client: it sends
each request and abort to the head, and one reader task on the event loop reads what the head
sends back (every few steps, a request's first token and its end at once: ``sharding.ring.FLUSH_S``)
and hands each request its tokens. Nothing per token crosses a thread or a Ray call; the per-token
work in this process is detokenizing.

The fast lane's replica holds one (``ShardedLaneEngine``, which also owns the ring), and so does
each front door that streams from the head itself (``serve.lanes.head_links``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

from tokenizers import Tokenizer

from sharding.config import ModelConfig
from sharding.pipeline import RingFailed
from sharding.ring import StepInfo, step_infos
from sharding.sampling import SamplingParams
from sharding.scheduler import validate_request
from sharding.transport import LinkClosed, frame, read_frame

from .. import metrics
from ..config import TelemetryConfig
from ..errors import LaneUnavailable
from .engine import EngineOutput, EngineRequest
from .step_spans import HopTotals, StepSpans
from .detokenizer import TextStream


class HeadClient:
    """Streams requests from a ring's head chip.

    Args:
        model_config: the fast model's config (what requests are validated against).
        max_len: tokens per sequence of the ring's KV cache.
        address: ``(host, port)`` of the head's client links; ``secret`` what a client sends first.
        tokenizer: the checkpoint's tokenizer (for detokenization and stop strings).
        layout: the ring's ``fastmode.tp``/``pp``/``transport`` (attributes of the step spans).
        telemetry: step-span sampling (``TelemetryConfig``).
    """

    def __init__(self, model_config: ModelConfig, max_len: int, address: tuple[str, int], secret: bytes,
                 tokenizer: Tokenizer, layout: dict[str, Any], telemetry: TelemetryConfig | None = None) -> None:
        self.model_config, self.max_len = model_config, max_len
        self.address, self.secret = tuple(address), secret
        self.tokenizer, self.layout = tokenizer, layout
        self.telemetry = telemetry or TelemetryConfig()
        self._sinks: dict[str, asyncio.Queue] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._connecting: asyncio.Lock | None = None
        self._error: BaseException | None = None
        self._steps = 0

    # -- the link to the head ------------------------------------------------------------------
    async def connect(self) -> asyncio.StreamWriter:
        """Open the link to the head (once; every request shares it)."""
        if self._writer is not None:
            return self._writer
        self._connecting = self._connecting or asyncio.Lock()
        async with self._connecting:
            if self._writer is None:
                reader, writer = await asyncio.open_connection(*self.address)
                writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                writer.write(self.secret)
                self._reader_task = asyncio.create_task(self._read(reader))
                self._writer = writer
        return self._writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                msg = await read_frame(reader)
                if msg[0] == "out":
                    self._deliver(msg[1], step_infos(msg[2]), msg[3])
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

    def _deliver(self, outputs: list[tuple], infos: list[StepInfo], report: bool) -> None:
        per: dict[str, list] = defaultdict(list)
        for rid, token, finished, reason, cached, logprobs in outputs:
            per[rid].append((token, finished, reason, cached, logprobs))
        for rid, outs in per.items():
            sink = self._sinks.get(rid)
            if sink is not None:
                sink.put_nowait((outs, infos))
        if report:  # one client of the ring counts each step (the head says which)
            for info in infos:
                self._steps += 1
                metrics.batch_size("fast", info.batch_size)
                if self._steps % metrics.HOP_EVERY == 0:
                    metrics.hops(info.hops)

    # -- LaneEngine ----------------------------------------------------------------------------
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """See ``LaneEngine.generate``. With the link up, the request goes to the head now, before
        the first output is asked for: a caller with work of its own before it waits (a front door
        writing ``response.created``) does that work during the prefill. What the request does not
        pass (``validate_request``, a stopped engine) is raised at the first output, as by any engine."""
        added: tuple[asyncio.Queue, int] | BaseException | None = None
        if self._writer is not None:
            try:
                added = self._add(request, self._check(request), self._writer)
            except Exception as e:  # noqa: BLE001 - raised at the first output
                added = e
        return _Outputs(self, request.request_id, isinstance(added, tuple), self._stream(request, added))

    def _check(self, request: EngineRequest) -> SamplingParams:
        """Typed errors before anything is sent; the request's sampling parameters."""
        if self._error is not None:
            raise LaneUnavailable(f"the fast lane's engine is not running ({self._error})")
        params = request.sampling()
        validate_request(self.model_config, self.max_len, request.request_id, request.prompt_ids, params)
        return params

    def _add(self, request: EngineRequest, params: SamplingParams, writer: asyncio.StreamWriter
             ) -> tuple[asyncio.Queue, int]:
        """Send a checked request to the head: its output queue and when it went."""
        sink: asyncio.Queue = asyncio.Queue()
        self._sinks[request.request_id] = sink
        added_ns = time.time_ns()
        writer.write(frame(("add", request.request_id, request.prompt_ids, params)))
        return sink, added_ns

    def _drop(self, rid: str, finished: bool) -> None:
        """The request's stream is over: forget it, and free its slot at the head unless it ended."""
        self._sinks.pop(rid, None)
        if not finished and self._writer is not None and self._error is None:
            with contextlib.suppress(Exception):  # closed early, or ended by a stop string
                self._writer.write(frame(("abort", rid)))

    async def _stream(self, request: EngineRequest, added) -> AsyncIterator[EngineOutput]:
        if isinstance(added, BaseException):
            raise added
        if added is None:  # the link was not up when the request came: it goes now
            params = self._check(request)
            added = self._add(request, params, await self.connect())
        rid = request.request_id
        sink, added_ns = added
        text = TextStream(self.tokenizer, request.stop, min_tokens=request.min_tokens)
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
                tokens = [o[0] for o in outs]
                logprobs = [o[4] for o in outs] if outs[0][4] is not None else None
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
                _, done, reason, _, _ = outs[-1]
                delta = text.push(tokens, stop_token=done and reason == "stop")
                if text.stopped or done:
                    finished = done
                    if not text.stopped:
                        delta += text.flush()
                    else:  # tokens after the one that completed the stop string are not output (vLLM's)
                        tokens, logprobs = tokens[:text.kept], logprobs and logprobs[:text.kept]
                    yield EngineOutput(tokens, delta, "stop" if text.stopped else reason, hops=hops.per_pair(),
                                       logprobs=logprobs, **first)
                    return
                yield EngineOutput(tokens, delta, logprobs=logprobs, **first)
        finally:
            self._drop(rid, finished)
            if spans is not None:
                spans.finish(hops)

    def failure(self) -> BaseException | None:
        return self._error

    def num_unfinished(self) -> int:
        return len(self._sinks)

    async def check_health(self) -> None:
        if self._error is not None:
            raise LaneUnavailable(f"the fast lane's engine has stopped ({self._error})")

    def close(self) -> None:
        """Close the link (the head drops this client's unfinished requests)."""
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()

    def shutdown(self) -> None:
        self.close()


class _Outputs:
    """One request's outputs from ``HeadClient.generate``: its generator, plus the cleanup an
    async generator skips when it is closed before it started (``sent``: the request went already)."""

    def __init__(self, client: HeadClient, rid: str, sent: bool, outputs: AsyncIterator[EngineOutput]) -> None:
        self._client, self._rid, self._outputs = client, rid, outputs
        self._unread_sent = sent
        """Sent, and not iterated yet: closing now must abort it at the head."""

    def __aiter__(self) -> _Outputs:
        return self

    async def __anext__(self) -> EngineOutput:
        self._unread_sent = False  # from here on the generator's own cleanup runs
        return await self._outputs.__anext__()

    async def aclose(self) -> None:
        if self._unread_sent:
            self._unread_sent = False
            self._client._drop(self._rid, finished=False)
        await self._outputs.aclose()
