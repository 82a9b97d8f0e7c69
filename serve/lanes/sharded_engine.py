"""``ShardedLaneEngine``: fastmode's own executor (``sharding``) behind the ``LaneEngine`` interface.

One background thread owns the engine and drives ``step()`` while there is work; the asyncio side
talks to it through a command queue (add, abort, stop) and receives each step's outputs in one
``call_soon_threadsafe`` per step, so nothing per token crosses threads. A step blocks on the
chips (compute and hops), never the event loop.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import torch
from tokenizers import Tokenizer

from sharding.engine import Engine, StepOutput
from sharding.pipeline import ShardedModel
from sharding.sampling import SamplingParams

from .. import metrics
from ..config import FastLaneConfig, TelemetryConfig
from ..errors import LaneUnavailable
from .engine import EngineOutput, EngineRequest
from .step_spans import StepInfo, StepSpans
from .text import TextStream

_STOP = ("stop",)


class ShardedLaneEngine:
    """The fast model, ``tp x pp`` over chips (or in this process when ``tp = pp = 1``).

    Args:
        path: the checkpoint directory.
        config: the fast lane's section of the deployment config.
        tokenizer: the checkpoint's tokenizer (for detokenization and stop strings).
    """

    def __init__(self, path: str | Path, config: FastLaneConfig, tokenizer: Tokenizer,
                 telemetry: TelemetryConfig | None = None) -> None:
        self.telemetry = telemetry or TelemetryConfig()
        self.layout = {"fastmode.tp": config.tp, "fastmode.pp": config.pp, "fastmode.transport": config.transport}
        dtype = getattr(torch, config.dtype)
        if config.tp * config.pp == 1:
            self.engine: Engine = Engine.from_pretrained(path, num_slots=config.num_slots, max_len=config.max_len,
                                                         dtype=dtype, device=config.device, compile=config.compile)
        else:
            self.engine = ShardedModel.from_pretrained(path, tp=config.tp, pp=config.pp, num_slots=config.num_slots,
                                                       max_len=config.max_len, dtype=dtype,
                                                       transport=config.transport, device=config.device)
        self.max_len = self.engine.max_len
        self.tokenizer = tokenizer
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, asyncio.Queue] = {}  # touched only on the event loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fast-lane-engine", daemon=True)
        self._thread.start()

    # -- the engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        steps = 0
        try:
            while True:
                # Idle: sleep until a command arrives. Busy: take whatever arrived during the step.
                cmd = self._commands.get() if not self.engine.has_work else self._poll()
                while cmd is not None:
                    if cmd is _STOP:
                        return
                    self._apply(cmd)
                    cmd = self._poll()
                if self.engine.has_work:
                    start = time.time_ns()
                    outputs = self.engine.step()
                    if outputs and self._loop is not None:
                        info = StepInfo(start, time.time_ns(), self.engine.last_hops, len(outputs))
                        self._loop.call_soon_threadsafe(self._deliver, outputs, info)
                        steps += 1
                        metrics.batch_size("fast", len(outputs))
                        if steps % metrics.HOP_EVERY == 0:
                            metrics.hops(info.hops)
        except BaseException as e:  # noqa: BLE001 - reported to every waiting request and to health checks
            self._error = e
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._fail_all, e)

    def _poll(self):
        try:
            return self._commands.get_nowait()
        except queue.Empty:
            return None

    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, rid, ids, params = cmd
            try:
                self.engine.add(rid, ids, params)
            except Exception as e:  # noqa: BLE001 - the request's own fault, reported to it alone
                self._loop.call_soon_threadsafe(self._fail, rid, e)
        elif cmd[0] == "abort":
            self.engine.abort(cmd[1])

    # -- the event loop ----------------------------------------------------------------------
    def _deliver(self, outputs: list[StepOutput], info: StepInfo) -> None:
        for o in outputs:
            sink = self._sinks.get(o.request_id)
            if sink is not None:
                sink.put_nowait((o, info))

    def _fail(self, rid: str, exc: BaseException) -> None:
        sink = self._sinks.get(rid)
        if sink is not None:
            sink.put_nowait(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for rid in list(self._sinks):
            self._fail(rid, LaneUnavailable(f"the fast lane's engine failed: {type(exc).__name__}: {exc}"))

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """See ``LaneEngine.generate``."""
        if self._error is not None or not self._thread.is_alive():
            raise LaneUnavailable(f"the fast lane's engine is not running ({self._error!r})")
        self._loop = asyncio.get_running_loop()
        rid = request.request_id
        params = SamplingParams(temperature=request.temperature, top_p=request.top_p, seed=request.seed,
                                max_tokens=request.max_tokens, ignore_eos=request.ignore_eos)
        self.engine.scheduler.validate(rid, request.prompt_ids, params)  # typed errors before queueing
        sink: asyncio.Queue = asyncio.Queue()
        self._sinks[rid] = sink
        added_ns = time.time_ns()
        self._commands.put(("add", rid, request.prompt_ids, params))
        text = TextStream(self.tokenizer, request.stop)
        spans = None
        if request.trace is not None:
            spans = StepSpans(request.trace, self.telemetry.step_spans_first, self.telemetry.step_spans_every,
                              self.layout)
        finished = False
        try:
            while True:
                item = await sink.get()
                if isinstance(item, BaseException):
                    finished = True  # never added, or the engine is gone
                    raise item
                out, info = item
                if spans is not None:
                    spans.step(info)
                first = {}
                if added_ns:  # this request's first output: its prefill step
                    first = {"queue_s": max(0, info.start_ns - added_ns) / 1e9, "batch_size": info.batch_size}
                    added_ns = 0
                delta = text.push(out.token_ids)
                if text.stopped or out.finished:
                    finished = out.finished
                    if not text.stopped:
                        delta += text.flush()
                    yield EngineOutput(out.token_ids, delta, "stop" if text.stopped else out.finish_reason, **first)
                    return
                yield EngineOutput(out.token_ids, delta, **first)
        finally:
            self._sinks.pop(rid, None)
            if not finished:  # closed early, or ended by a stop string: free the slot
                self._commands.put(("abort", rid))
            if spans is not None:
                spans.finish()

    def num_unfinished(self) -> int:
        return self.engine.num_unfinished

    async def check_health(self) -> None:
        if self._error is not None or not self._thread.is_alive():
            raise LaneUnavailable(f"the fast lane's engine thread has stopped ({self._error!r})")

    def shutdown(self) -> None:
        self._commands.put(_STOP)
        self._thread.join(timeout=30)
        if isinstance(self.engine, ShardedModel):
            self.engine.shutdown()
