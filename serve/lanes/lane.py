"""``Lane``: the Serve deployment behind each lane (fast, priority, standard, exact).

It makes the prompt its model's ids (``serve.lanes.prompt_ids``: a text as it is, chat messages
through the model's chat template), checks the context budget and the batch cap, drives the lane's engine
and streams coalesced ``delta`` events, then one ``done`` event with usage, timing and cost. The
lanes differ only by configuration: which engine (``ShardedLaneEngine``, ``VLLMLaneEngine``, and
for exact by default ``SpeculativeLaneEngine``), its batch cap, its price, and for exact the fast
model drafting for the full one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from tokenizers import Tokenizer


from .. import metrics, telemetry
from ..config import LANE_CONFIGS, FastLaneConfig, TelemetryConfig, VLLMLaneConfig
from ..chat import end_of_turn_ids
from ..errors import LaneUnavailable, Overloaded, to_event
from ..request import LaneRequest
from ..coalesce import coalesce
from .engine import EngineOutput, EngineRequest, LaneEngine
from .lane_links import LinkServer
from .prompt_ids import PromptIds
from .sampling import engine_request as engine_request_for
from .sampling import default_max_tokens, generation_defaults, output_budget, vocab_size

FAST = "fast"
PRIORITY = "priority"
STANDARD = "standard"
EXACT = "exact"
LANES = (FAST, PRIORITY, STANDARD, EXACT)
REBUILD_RETRY_S = 5.0
"""``retry_after`` of the requests refused while a dead engine is rebuilt."""
WARMUP_REQUESTS = (("def main():\n", 8), ("import os\nimport sys\n\n\ndef parse_args(argv):\n    " * 4, 16))
"""(prompt, output tokens) of ``Lane.warmup``: a short and a longer prompt, so that prefill and
decode of both sizes (and the exact lane's verify steps) have run once before any user's."""
MIN_STREAM_INTERVAL_S = 0.005
"""The shortest coalescing window (the longest is the lane's ``stream_interval_ms``); in between
it adapts to what a streamed chunk costs Ray Serve (``serve.coalesce.coalesce``)."""


def _is_last(out: EngineOutput) -> bool:
    return out.finish_reason is not None


class Lane:
    """One replica of a lane (deployed by ``serve.app``; usable directly in tests).

    Args:
        lane: ``"fast"``, ``"priority"``, ``"standard"`` or ``"exact"``.
        model_id: the id the model is served under.
        model_path: its checkpoint directory.
        config: the lane's config section (a dict, as Serve passes it).
        telemetry: the config's ``telemetry`` section (step spans of the fast lane).
        draft_path: the exact lane's drafter (the fast model's checkpoint).
        engine: an engine another process owns, to serve from here (a front door's own fast lane,
            streaming from the head chip: ``serve.lanes.head_links``); it is not rebuilt here when it
            fails (its owner rebuilds it). ``None``: build and own the lane's engine.
        door: the fast lane: the application's config (a dict) when its head serves the lane's own
            WebSocket (``serve.lanes.door``: bound to ``http.host``, with the gateway's keys and limits).
        chat_template, chat_template_kwargs: the model's ``models.<model>`` settings: a template to
            use instead of the checkpoint's, and variables every rendering gets.
    """

    def __init__(self, lane: str, model_id: str, model_path: str, config: dict[str, Any],
                 telemetry_config: dict[str, Any] | None = None, draft_path: str | None = None,
                 engine: LaneEngine | None = None, door: dict[str, Any] | None = None,
                 chat_template: str | None = None, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        if engine is None:
            telemetry.setup(f"{lane}-lane")
        self.lane, self.model_id = lane, model_id
        self.tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
        self.prompt_ids = PromptIds.for_model(model_path, self.tokenizer, chat_template=chat_template,
                                              chat_template_kwargs=chat_template_kwargs)
        """Makes prompts ids, through the model's chat template if it has one (``serve.lanes.prompt_ids``)."""
        self.stop_ids = end_of_turn_ids(model_path)
        """Ids that end a turn (config.json's, generation_config.json's and the tokenizer's eos): every
        request stops on them unless it sets ``ignore_eos``."""
        self.sampling_defaults = generation_defaults(model_path)
        """The model's sampling defaults (``serve.lanes.sampling``), for the fields a request leaves unset."""
        self.max_tokens = default_max_tokens(model_path)
        """``generation_config.json``'s ``max_new_tokens``: the most tokens a request without
        ``max_output_tokens`` gets (``None``: the rest of the context)."""
        self.vocab_size = vocab_size(model_path)
        self.config: FastLaneConfig | VLLMLaneConfig = LANE_CONFIGS[lane].model_validate(config)
        self.door = None if door is None or lane != FAST else _door_spec(door, model_id, model_path, self.config)
        self._engine_args = (model_path, TelemetryConfig.model_validate(telemetry_config or {}), draft_path)
        self.owns_engine = engine is None
        self.engine: LaneEngine = self._build_engine() if engine is None else engine
        self.cap = None if lane == FAST or self.config.admission != "reject" else self.config.max_num_seqs
        self.rebuilds: list[dict[str, Any]] = []
        """Each engine rebuild after a failure: why, when, how long it took (``seconds``; of it,
        ``build_s`` to build the engine, compiling included, and ``warmup_s`` for ``warmup``), and
        whether it worked."""
        self._rebuilding: asyncio.Task | None = None
        self._warmup_ids: set[str] = set()
        self.in_flight = 0
        self.cancelled = 0
        self.warm: dict[str, Any] | None = None
        """What ``warmup`` measured (``None``: not warmed up)."""
        self.link = LinkServer(self.generate)

    def _build_engine(self) -> LaneEngine:
        model_path, telemetry_config, draft_path = self._engine_args
        if self.lane == FAST:
            from .sharded_engine import ShardedLaneEngine

            return ShardedLaneEngine(model_path, self.config, self.tokenizer, telemetry_config, door=self.door)
        if self.lane == EXACT and self.config.engine == "fastmode":
            from .speculative_engine import SpeculativeLaneEngine

            return SpeculativeLaneEngine(model_path, draft_path, self.config, self.tokenizer)
        from .vllm_engine import VLLMLaneEngine

        return VLLMLaneEngine(model_path, self.config, draft_path if self.lane == EXACT else None)

    # -- engine failures --------------------------------------------------------------------------
    def _unavailable(self, why: BaseException | str) -> LaneUnavailable:
        return LaneUnavailable(f"the {self.lane} lane's engine failed ({why}); it is being rebuilt, retry "
                               f"shortly", retry_after=REBUILD_RETRY_S)

    def _engine_failed(self) -> BaseException | None:
        """The engine's failure, if it has died; starts its rebuild (once)."""
        failure = self.engine.failure()
        if failure is not None and self._rebuilding is None and self.owns_engine:
            self._rebuilding = asyncio.get_running_loop().create_task(self._rebuild(failure))
        return failure

    async def _rebuild(self, failure: BaseException) -> None:
        """Replace a dead engine in this replica (its chips or engine process are rebuilt; the
        replica, its links and the application stay): shut the old one down, build and warm up a
        new one. Requests meanwhile get ``lane_unavailable`` with ``retry_after``."""
        started, record = time.perf_counter(), {"why": f"{type(failure).__name__}: {failure}"[:300],
                                                "at": time.time(), "ok": False}
        self.rebuilds.append(record)
        try:
            old = self.engine
            await asyncio.to_thread(_shutdown_quietly, old)
            t0 = time.perf_counter()
            self.engine = await asyncio.to_thread(self._build_engine)  # the fast lane's compile is here
            record["build_s"] = round(time.perf_counter() - t0, 3)
            t0 = time.perf_counter()
            await self.warmup()
            record["warmup_s"] = round(time.perf_counter() - t0, 3)
            record["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported by check_health: Serve replaces the replica
            record["error"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            record["seconds"] = round(time.perf_counter() - started, 3)
            if record["ok"]:
                self._rebuilding = None

    async def link_address(self) -> dict[str, Any]:
        """Where a front door's router streams from this replica directly (``serve.lanes.lane_links``):
        replica id, host (this node's IP), port and the connection's secret; on the fast lane also
        ``head``, where it may stream from the ring's head chip itself (``serve.lanes.head_links``)."""
        import ray

        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        where = await self.link.address(host)
        head_address = getattr(self.engine, "head_address", None)
        if head_address is not None and self._rebuilding is None:
            where["head"] = head_address()  # the fast lane: its ring's head chip (serve.lanes.head_links)
        return where

    async def generate(self, request: LaneRequest) -> AsyncIterator[dict[str, Any]]:
        """Stream one request: ``accepted`` (``input_tokens``), ``delta`` events, then ``done``.

        ``accepted`` comes before any engine work, so a caller learns of a refusal (a typed
        exception) or an admission at once.
        """
        arrived = time.perf_counter()
        span = telemetry.tracer().start_span(f"fastmode.lane {self.lane}", context=telemetry.extract(
            request.trace), attributes={"fastmode.lane": self.lane, "gen_ai.request.model": self.model_id})
        events = self._generate(request, arrived, span)
        try:
            async for event in events:
                yield event
        except BaseException as e:
            if isinstance(e, Exception):
                span.set_status(Status(StatusCode.ERROR, to_event(e)["code"]))
            else:
                span.set_attribute("fastmode.cancelled", True)
            raise
        finally:
            await events.aclose()  # closed early by the caller: run its cleanup now, not at GC
            span.end()

    async def _generate(self, request: LaneRequest, arrived: float, span) -> AsyncIterator[dict[str, Any]]:
        if request.request_id not in self._warmup_ids and (self._rebuilding is not None
                                                           or self._engine_failed() is not None):
            raise self._unavailable(self.rebuilds[-1]["why"] if self.rebuilds else "it has died")
        if self.cap is not None and self.in_flight >= self.cap:
            raise Overloaded(f"the {self.lane} lane's batch is full ({self.cap} sequences)",
                             retry_after=self.config.retry_after_s)
        ids, continues = self.prompt_ids.encode_prompt(request.prompt)
        n_prompt = len(ids)
        max_tokens = output_budget(request.max_output_tokens, n_prompt, self.engine.max_len, self.max_tokens,
                                   self.model_id)
        engine_request = engine_request_for(
            request, ids, max_tokens, defaults=self.sampling_defaults, stop_ids=self.stop_ids,
            vocab_size=self.vocab_size, continues=continues,
            trace=trace.set_span_in_context(span) if span.is_recording() else None)
        if (check := getattr(self.engine, "check_request", None)) is not None:
            check(engine_request)  # what the engine refuses, refused before the request is accepted
        # A front door's own lane starts the engine's request before ``accepted``: the caller's
        # handling of it (``response.created`` written to the client) overlaps the prefill. An
        # engine this lane owns is iterated by the lane's own task, which writes ``accepted`` and
        # goes on without waiting for the caller.
        early = None if self.owns_engine else self.engine.generate(engine_request)
        self.in_flight += 1
        done = False
        try:
            yield {"type": "accepted", "input_tokens": n_prompt}
            n_out, seq, first, last, reason, queue_s, hops, spec = 0, 0, None, None, None, None, None, None
            cached = 0
            async for outs in self._outputs(engine_request, early):
                now = time.perf_counter()
                first = first or now
                last = now
                text = "".join(o.text for o in outs)
                tokens = sum(len(o.token_ids) for o in outs)
                n_out += tokens
                reason = outs[-1].finish_reason or reason
                hops = outs[-1].hops  # on the last output only
                spec = outs[-1].speculative or spec
                if n_out == tokens:  # the request's first output
                    queue_s = outs[0].queue_s
                    cached = outs[0].cached_tokens or 0
                    if self.lane != FAST and outs[0].batch_size is not None:
                        metrics.batch_size(self.lane, outs[0].batch_size)
                entries = self._logprobs(outs) if request.logprobs is not None else None
                if text or entries:
                    delta = {"type": "delta", "seq": seq, "text": text, "tokens": tokens}
                    if entries:
                        delta["logprobs"] = entries
                    yield delta
                    seq += 1
            done = True
            event = self._done(n_prompt, n_out, reason, arrived, first, last)
            event["usage"]["input_tokens_details"] = {"cached_tokens": cached}
            if hops is not None:
                event["hops"] = hops
            if spec is not None:
                event["speculative"] = spec
                metrics.speculative(self.lane, spec)
            metrics.latency(self.lane, ttft=event["timing"]["ttft_s"], queue=queue_s,
                            tpot=(last - first) / (n_out - 1) if first is not None and n_out > 1 else None)
            if span.is_recording():
                self._record(span, event, arrived, first, last)
            yield event
        finally:
            self.in_flight -= 1
            self.cancelled += not done
            if early is not None:  # iterated by this task only, so closing it here is safe
                await early.aclose()

    def _logprobs(self, outs: list[EngineOutput]) -> list[dict[str, Any]]:
        """The outputs' tokens' log probabilities as the deltas carry them: per token its text (the
        token decoded alone, special tokens included, as vLLM's), id, log probability and
        ``top_logprobs``, the most likely tokens' alike."""
        def text(t: int) -> str:
            return self.tokenizer.decode([t], skip_special_tokens=False)

        return [{"token": text(t), "id": t, "logprob": own,
                 "top_logprobs": [{"token": text(i), "id": i, "logprob": v} for i, v in zip(ids, values, strict=True)]}
                for o in outs if o.logprobs
                for t, (own, ids, values) in zip(o.token_ids, o.logprobs, strict=True)]

    async def _outputs(self, engine_request: EngineRequest, early: AsyncIterator[EngineOutput] | None = None
                       ) -> AsyncIterator[list[EngineOutput]]:
        """The engine's coalesced outputs; a dead engine's failure becomes ``lane_unavailable``
        (retryable) and starts the engine's rebuild.

        A front door's own lane (an engine it does not own: ``serve.lanes.head_links``) passes each output
        on as it comes: its events cross no process (no Serve item, no link frame) on their way to the
        caller, and the head already bundles a request's tokens per message (``sharding.ring.FLUSH_S``),
        so coalescing would buy nothing but a task and a queue between the head and the first token.
        ``early``: the engine's stream if it was started already (``engine.generate(engine_request)``)."""
        engine = self.engine
        try:
            if early is not None:
                async for out in early:
                    yield [out]
                return
            async for outs in coalesce(engine.generate(engine_request), self.config.stream_interval_ms / 1e3,
                                       min_interval_s=MIN_STREAM_INTERVAL_S, final=_is_last):
                yield outs
        except Exception as e:
            if engine is self.engine and self._engine_failed() is not None:
                raise self._unavailable(self.engine.failure()) from e
            if engine is not self.engine:  # a rebuild replaced it while this request ran
                raise self._unavailable(e) from e
            raise

    def _done(self, n_prompt: int, n_out: int, reason: str | None, arrived: float,
              first: float | None, last: float | None) -> dict[str, Any]:
        ttft = None if first is None else first - arrived
        decode = None
        if first is not None and n_out > 1 and last > first:
            decode = (n_out - 1) / (last - first)
        return {
            "type": "done", "lane": self.lane, "model": self.model_id, "finish_reason": reason or "abort",
            "usage": {"input_tokens": n_prompt, "output_tokens": n_out, "total_tokens": n_prompt + n_out},
            "timing": {"ttft_s": ttft, "decode_tokens_per_s": decode, "total_s": time.perf_counter() - arrived},
            "cost_units": self.config.price * (n_prompt + n_out) / 1000,
        }

    def _record(self, span, done: dict[str, Any], arrived: float, first: float | None, last: float | None) -> None:
        usage, timing = done["usage"], done["timing"]
        span.set_attributes({"gen_ai.usage.input_tokens": usage["input_tokens"],
                             "gen_ai.usage.output_tokens": usage["output_tokens"],
                             "gen_ai.response.finish_reasons": [done["finish_reason"]],
                             "fastmode.engine_ttft_s": timing["ttft_s"] or 0.0})
        spec = done.get("speculative")
        if spec is not None:
            span.set_attributes({"fastmode.spec.draft_tokens": spec["draft_tokens"],
                                 "fastmode.spec.verify_steps": spec["verify_steps"],
                                 "fastmode.spec.acceptance_rate": spec["acceptance_rate"],
                                 "fastmode.spec.tokens_per_step": spec["tokens_per_step"]})
        if self.lane != FAST and first is not None:
            # vLLM's steps are not visible from here: the lane-side view of prefill and decode.
            # (vLLM's own tracing adds its spans: engine_args {otlp_traces_endpoint: ...}.)
            now_ns, now = time.time_ns(), time.perf_counter()
            at = lambda t: now_ns - int((now - t) * 1e9)  # noqa: E731 - perf_counter -> epoch ns
            ctx = trace.set_span_in_context(span)
            for name, a, b in (("fastmode.prefill", arrived, first), ("fastmode.decode", first, last)):
                s = telemetry.tracer().start_span(name, context=ctx, start_time=at(a),
                                                  attributes={"fastmode.engine": "vllm"})
                s.end(end_time=at(b))

    async def warmup(self) -> dict[str, Any]:
        """Serve a few short requests through this replica's whole path (tokenizer, engine,
        coalescing), so that the first user's request does not pay what an engine does only on its
        first requests (vLLM's first steps of each kind, the fast lane's link to its head chip).
        The Serve deployment (``serve.app``) awaits it before the replica counts as ready. Returns
        each warm-up request's seconds; the engine's counters are reset so they count users only."""
        started = time.perf_counter()
        took = []
        for i, (prompt, tokens) in enumerate(WARMUP_REQUESTS):
            t0 = time.perf_counter()
            request = LaneRequest(request_id=f"warmup-{self.lane}-{len(self.rebuilds)}-{i}", prompt=prompt,
                                  max_output_tokens=tokens, temperature=0.0, top_p=1.0, top_k=None, min_p=None,
                                  repetition_penalty=None, presence_penalty=None, frequency_penalty=None,
                                  seed=None, logit_bias=None, stop=(), stop_token_ids=(), min_tokens=0,
                                  logprobs=None, ignore_eos=True, trace=None)
            self._warmup_ids.add(request.request_id)
            try:
                async for _ in self.generate(request):
                    pass
            finally:
                self._warmup_ids.discard(request.request_id)
            took.append(round(time.perf_counter() - t0, 4))
        self.cancelled = 0
        self.warm = {"requests_s": took, "total_s": round(time.perf_counter() - started, 3)}
        return self.warm

    async def stats(self) -> dict[str, Any]:
        """This replica's load: requests in the engine (``running``; on the fast lane the ring's, from
        every client, with ``ring_clients``: this replica and the front doors' head links, and
        ``ring_aborted``: requests it dropped before their end, from any client), streams
        open here, and streams closed before their end (``cancelled``, since start); the fast lane's chip layout and
        prefix cache too (``parked`` slots, ``hits``, ``reused_tokens``), and on our executor's
        lanes the linears running from packed bfloat16 weights (``sharding.packed``: per chip on
        the fast lane, per model on the exact lane; 0: off), and on the exact lane whether its models
        run compiled yet (``compile``: ``SpeculativeLaneEngine.compile_status``); on vLLM's lanes with
        ``sessions``, the conversations kept in vLLM (``parked``, ``continued`` turns, ``reused_tokens``)."""
        stats = {"lane": self.lane, "model": self.model_id, "running": self.engine.num_unfinished(),
                 "in_flight": self.in_flight, "cap": self.cap, "cancelled": self.cancelled, "warmup": self.warm,
                 "rebuilding": self._rebuilding is not None, "rebuilds": self.rebuilds}
        if self.lane == FAST:
            if not self._rebuilding:  # the ring's requests from every client, front doors' head links too
                load = await self.engine.ring_load()
                stats["running"], stats["ring_clients"] = load["running"], load["clients"]
                stats["ring_aborted"], stats["door"] = load["aborted"], load.get("door")
            stats["layout"] = {"tp": self.engine.tp, "pp": self.engine.pp, "why": self.engine.layout_reason}
            stats["prefix_cache"] = None if self._rebuilding else await self.engine.prefix_stats()
            stats["packed_linears"] = None if self._rebuilding else self.engine.model.packed_linears
        elif self.lane == EXACT and self.config.engine == "fastmode":
            stats["prefix_cache"] = None if self._rebuilding else self.engine.prefix_stats()
            stats["packed_linears"] = None if self._rebuilding else self.engine.packed_linears()
            stats["compile"] = None if self._rebuilding else self.engine.compile_status()
        if (sessions := getattr(self.engine, "sessions", None)) is not None:
            stats["sessions"] = sessions.stats()
        return stats

    async def check_health(self) -> None:
        """Serve's health check. A dead engine is rebuilt in place (``_rebuild``), and the replica
        stays healthy meanwhile; it raises (so Serve replaces the replica) only if a rebuild failed."""
        if self._rebuilding is not None:
            if self._rebuilding.done() and self.rebuilds and not self.rebuilds[-1]["ok"]:
                raise LaneUnavailable(f"the {self.lane} lane's engine could not be rebuilt: "
                                      f"{self.rebuilds[-1].get('error')}")
            return
        try:
            await self.engine.check_health()
        except Exception:
            if self._engine_failed() is None:
                raise

    def __del__(self) -> None:
        link = getattr(self, "link", None)
        if link is not None:
            link.close()
        engine = getattr(self, "engine", None)
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass


def _door_spec(app: dict[str, Any], model_id: str, model_path: str, config: FastLaneConfig):
    """The fast lane's ``DoorSpec`` from the application's config: ``http.host``, the gateway's API
    keys (read here as the gateway reads them; a public bind without keys is refused alike) and limits."""
    from ..auth import load_keys
    from ..config import load_config
    from .door import DoorSpec

    app_config = load_config(app)
    fast = app_config.models.fast
    return DoorSpec(model_id=model_id, model_path=model_path, price=config.price, host=app_config.http.host,
                    port=config.door_port, keys=load_keys(app_config),
                    limits=app_config.gateway.model_dump(mode="json"), chat_template=fast.chat_template,
                    chat_template_kwargs=fast.chat_template_kwargs)


def _shutdown_quietly(engine: LaneEngine) -> None:
    try:
        engine.shutdown()
    except Exception:  # noqa: BLE001 - a dead engine's remains: best effort
        pass


__all__ = ["Lane", "LANES", "FAST", "PRIORITY", "STANDARD", "EXACT", "EngineOutput"]
