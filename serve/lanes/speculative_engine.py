"""``SpeculativeLaneEngine``: the exact lane on fastmode's own executor (``sharding.speculative``).

The full model verifies what the fast model drafts, both in this replica's process: one engine
thread owns the ``SpeculativeEngine`` (and its KV caches) and loops, taking new requests and
aborts from a queue, running a step, and handing each request's output to the event loop that
asked for it. Nothing per token crosses a process; the per-token work on the event loop is detokenizing.

The thread (``exact-engine``, by that name in ``top`` and ``py-spy``) runs on the node's compute
cores (``sharding.cpus``: the replica's other threads stay on the serving ones) with ``threads``
torch threads, beside vLLM's engines where they share those cores.

With ``compile`` and ``compile_in_background`` (the defaults) the lane starts on eager models, which
load in seconds, while a second thread (``exact-compile``, on the serving cores) builds the compiled
engine and warms it up over every shape the lane meets; then the engine thread switches to it. A
request runs wholly on the engine it started on: the ones running at the switch finish on the eager
engine, stepped in turn with the compiled one until they end (the same tokens either way: greedy
output is the full model's on both). ``compile_status`` says where it is (``/health``). Without
``compile_in_background`` the compiled engine is built and warmed up before the lane starts.

The compile thread traces in Python, holding the GIL, and the eager engine thread needs the GIL back
after every op it runs (hundreds a step): at the interpreter's default switch interval (5 ms) each of
those waits can take the whole interval, and a request can stall for tens of seconds. While the
compile runs, the interval is ``COMPILE_SWITCH_INTERVAL_S`` (decision 025 has the measurements).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import torch
from tokenizers import Tokenizer

from sharding import cpus
from sharding.errors import DuplicateRequest
from sharding.packed import resolve as resolve_packed
from sharding.speculative import SpecStats, SpeculativeEngine

from ..config import ExactLaneConfig
from ..errors import LaneUnavailable
from .engine import EngineOutput, EngineRequest
from .detokenizer import TextStream

log = logging.getLogger(__name__)

START_TIMEOUT_S = 900.0
"""How long the replica waits for the engine thread to load (and, compiling before it starts, to
compile and warm up) both models."""


def speculative_summary(stats: SpecStats, k: int) -> dict:
    """``EngineOutput.speculative`` of one request (the fields vLLM's exact lane reports). ``k`` is
    the engine's configured drafts per round, the most adaptive ``k`` may choose (vLLM's
    ``num_spec_tokens``), not the ``k`` of the engine's latest round: that one follows measured step
    times and may be below what this request's rounds drafted."""
    steps = stats.rounds
    return {"draft_tokens": k, "verify_steps": steps, "drafted": stats.drafted, "accepted": stats.accepted,
            "acceptance_rate": stats.acceptance if stats.drafted else 0.0,
            "tokens_per_step": 1 + stats.accepted / steps if steps else 1.0}


THREAD_NAME = "exact-engine"
"""The engine thread's name, also the OS's (``/proc/<pid>/task/<tid>/comm``: top, py-spy, tests)."""

COMPILE_THREAD_NAME = "exact-compile"
"""The name of the thread that compiles the engine in the background."""

COMPILE_SWITCH_INTERVAL_S = 0.0002
"""``sys.setswitchinterval`` while a background compile runs: how long the eager engine thread waits at
most for the GIL that the compile thread's tracing holds, each time it takes the GIL back."""

_switch_lock = threading.Lock()
_switch_holders = 0
_switch_before = 0.0


@contextlib.contextmanager
def _short_switch_interval():
    """``COMPILE_SWITCH_INTERVAL_S`` while any background compile of this process runs; the interval
    before the first of them comes back when the last ends."""
    global _switch_holders, _switch_before
    with _switch_lock:
        if _switch_holders == 0:
            _switch_before = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_before, COMPILE_SWITCH_INTERVAL_S))
        _switch_holders += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_holders -= 1
            if _switch_holders == 0:
                sys.setswitchinterval(_switch_before)


def _name_thread(name: str = THREAD_NAME) -> None:
    """Name the calling thread for the OS."""
    with contextlib.suppress(Exception):  # Linux only; a name is a convenience
        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME: this thread


def _on_serving_cpus() -> None:
    """Run the calling thread (and the compiler processes it starts) on the serving CPUs, where
    placement is on: a compile in the background takes no compute core from the lanes' steps."""
    plan = cpus.plan()
    if plan is not None:
        os.sched_setaffinity(0, plan.serving)  # pid 0: the calling thread only, on Linux


class SpeculativeLaneEngine:
    """The full model's exact output, drafted by the fast model, in one engine thread.

    Args:
        path: the full model's checkpoint (the target).
        draft_path: the fast model's (the drafter; same tokenizer).
        config: the exact lane's section of the deployment config.
        tokenizer: the full model's tokenizer (detokenization and stop strings).
    """

    def __init__(self, path: str | Path, draft_path: str | Path, config: ExactLaneConfig,
                 tokenizer: Tokenizer) -> None:
        self.config, self.tokenizer = config, tokenizer
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._engine: SpeculativeEngine | None = None
        self._stopping = False
        self._background = config.compile and config.compile_in_background
        self._compile: dict = {"state": "compiling" if config.compile else "off", "seconds": None, "error": None}
        self._thread = threading.Thread(target=self._run, args=(path, draft_path), name=THREAD_NAME, daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            self._error = TimeoutError(f"the exact lane's engine did not start in {START_TIMEOUT_S:.0f} s")
        if self._error is not None:
            self.shutdown()
            raise LaneUnavailable(f"the exact lane's engine did not start: {self._error}") from self._error
        self.max_len = self._engine.max_len
        if self._background:
            threading.Thread(target=self._compile_in_background, args=(path, draft_path),
                             name=COMPILE_THREAD_NAME, daemon=True).start()

    # -- the engine thread ---------------------------------------------------------------------
    def _build(self, path: str | Path, draft_path: str | Path, compile: bool) -> SpeculativeEngine:
        c = self.config
        torch.set_num_threads(c.threads)
        dtype = getattr(torch, c.dtype)
        engine = SpeculativeEngine.from_pretrained(
            path, draft_path, dtype=dtype, num_slots=c.max_num_seqs, max_len=c.max_model_len,
            k=c.num_speculative_tokens, adaptive=c.adaptive_k, compile=compile, compile_regions=c.compile_regions,
            prefix_cache=c.prefix_cache,
            packed_weights=resolve_packed(c.packed_weights, "cpu", dtype),
            draft_vocab_size=c.draft_vocab,
            kv_cache_bytes=c.kv_cache_memory_bytes if isinstance(c.kv_cache_memory_bytes, int) else None)
        if compile:
            engine.warm_up()  # every shape the lane meets, compiled now, not on a user's request
        return engine

    def _run(self, path: str | Path, draft_path: str | Path) -> None:
        _name_thread()
        # Loading (compiling and warming up, unless that is left to the background) on every CPU of
        # the node (the replica's own threads are on the serving ones), then this thread and the
        # torch threads it started on the compute ones.
        cpus.unplace(this_thread=True)
        try:
            t0 = time.perf_counter()
            compile = self.config.compile and not self._background
            self._engine = self._build(path, draft_path, compile)
            if compile:
                self._compile.update(state="compiled", seconds=round(time.perf_counter() - t0, 1))
        except BaseException as e:  # noqa: BLE001 - reported by __init__
            self._error = e
            return
        finally:
            cpus.place_unplaced("compute")
            self._ready.set()
        # ``old``: the eager engine after a switch, stepped in turn with ``engine`` until the requests
        # it holds have ended (then dropped); new requests go to ``engine``.
        engine, old, added = self._engine, None, {}
        try:
            while True:
                item = self._inbox.get() if not (engine.has_work or old is not None) else self._next()
                while item is not None:
                    if item[0] == "stop":
                        return
                    if item[0] == "switch":
                        old, engine = engine, item[1]
                        self._engine = engine
                        self._compile.update(state="compiled", seconds=item[2])
                    else:
                        self._handle(engine, old, item, added)
                    item = self._next()
                for e in (old, engine):
                    if e is not None and e.has_work:
                        self._step(e, added)
                if old is not None and not old.has_work:
                    old = None  # its last request has ended: the eager models are freed
        except BaseException as e:  # noqa: BLE001 - every waiting request hears of it, and check_health
            self._error = e
            for rid in list(self._sinks):
                self._put(rid, LaneUnavailable(f"the exact lane's engine failed: {type(e).__name__}: {e}"))

    def _step(self, engine: SpeculativeEngine, added: dict[str, float]) -> None:
        start = time.perf_counter()
        outs = engine.step()
        first = {o.request_id: (start - added.pop(o.request_id), engine.num_running)
                 for o in outs if o.request_id in added}
        spec = {rid: speculative_summary(s, engine.k_start) for rid, s in engine.finished_stats.items()}
        for o in outs:
            self._put(o.request_id, (o, first.get(o.request_id), spec.get(o.request_id)))

    def _compile_in_background(self, path: str | Path, draft_path: str | Path) -> None:
        """Build the compiled engine and warm it up, then hand it to the engine thread. A failure
        leaves the lane on its eager engine (``compile_status``: ``failed``)."""
        _name_thread(COMPILE_THREAD_NAME)
        _on_serving_cpus()
        t0 = time.perf_counter()
        try:
            with _short_switch_interval():
                engine = self._build(path, draft_path, compile=True)
        except Exception as e:  # noqa: BLE001 - the eager engine serves on
            log.warning("the exact lane's compile failed; it stays eager: %s: %s", type(e).__name__, e)
            self._compile.update(state="failed", error=f"{type(e).__name__}: {e}"[:300])
            return
        if not self._stopping:
            self._inbox.put(("switch", engine, round(time.perf_counter() - t0, 1)))

    def _next(self):
        try:
            return self._inbox.get_nowait()
        except queue.Empty:
            return None

    def _handle(self, engine: SpeculativeEngine, old: SpeculativeEngine | None, item: tuple,
                added: dict[str, float]) -> None:
        if item[0] == "abort":
            if not engine.abort(item[1]) and old is not None:
                old.abort(item[1])
            added.pop(item[1], None)
            return
        _, rid, prompt, params, at = item
        try:
            engine.add(rid, prompt, params)
            added[rid] = at
        except Exception as e:  # noqa: BLE001 - a typed error for that request only
            self._put(rid, e)

    def _put(self, rid: str, item) -> None:
        """Hand ``item`` to request ``rid``'s stream, on its event loop (gone: dropped)."""
        sink = self._sinks.get(rid)
        if sink is not None:
            loop, q = sink
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(q.put_nowait, item)

    # -- LaneEngine ----------------------------------------------------------------------------
    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """See ``LaneEngine.generate``."""
        if self._error is not None:
            raise LaneUnavailable(f"the exact lane's engine is not running ({self._error})")
        rid = request.request_id
        params = request.sampling()
        self._engine.validate(rid, list(request.prompt_ids), params)  # typed errors before anything is queued
        if rid in self._sinks:
            raise DuplicateRequest(f"request {rid!r} is already in flight")
        sink: asyncio.Queue = asyncio.Queue()
        self._sinks[rid] = (asyncio.get_running_loop(), sink)
        self._inbox.put(("add", rid, list(request.prompt_ids), params, time.perf_counter()))
        text = TextStream(self.tokenizer, request.stop, min_tokens=request.min_tokens)
        finished = False
        try:
            while True:
                item = await sink.get()
                if isinstance(item, BaseException):
                    finished = True  # never added, or the engine is gone
                    raise item
                out, first, spec = item
                extra = {}
                if first is not None:
                    extra = {"queue_s": first[0], "batch_size": first[1], "cached_tokens": out.cached}
                delta = text.push(out.token_ids, stop_token=out.finished and out.finish_reason == "stop")
                if text.stopped or out.finished:
                    finished = out.finished
                    tokens, logprobs = out.token_ids, out.logprobs
                    if not text.stopped:
                        delta += text.flush()
                    else:  # drafts accepted past the one that completed the stop string are not output (vLLM's)
                        tokens, logprobs = tokens[:text.kept], logprobs and logprobs[:text.kept]
                    yield EngineOutput(tokens, delta, "stop" if text.stopped else out.finish_reason,
                                       speculative=spec, logprobs=logprobs, **extra)
                    return
                yield EngineOutput(out.token_ids, delta, logprobs=out.logprobs, **extra)
        finally:
            self._sinks.pop(rid, None)
            if not finished:  # closed early, or ended by a stop string: free the slot
                self._inbox.put(("abort", rid))

    def failure(self) -> BaseException | None:
        if self._error is None and not self._thread.is_alive() and self._ready.is_set():
            self._error = RuntimeError("the exact lane's engine thread has exited")
        return self._error

    def num_unfinished(self) -> int:
        return len(self._sinks)

    async def check_health(self) -> None:
        if self.failure() is not None:
            raise LaneUnavailable(f"the exact lane's engine has stopped ({self._error})")

    def compile_status(self) -> dict:
        """Where the compiled models are: ``state`` (``off``: eager by config; ``compiling``: the lane
        serves eager meanwhile; ``compiled``: requests run compiled; ``failed``: the compile raised,
        the lane serves eager), ``seconds`` the compile and warm-up took, and a failure's ``error``."""
        return dict(self._compile)

    def packed_linears(self) -> dict[str, int] | None:
        """Linears of each model on packed bfloat16 weights (``SpeculativeEngine.packed_linears``)."""
        return dict(self._engine.packed_linears) if self._engine is not None else None

    def prefix_stats(self) -> dict[str, int] | None:
        """The prefix cache's counters (read between steps; a dict copy)."""
        return self._engine.prefix_stats() if self._engine is not None else None

    def shutdown(self) -> None:
        self._stopping = True  # a compile still under way is dropped when it ends (it cannot be interrupted)
        self._inbox.put(("stop",))
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
