"""``Lane``: the Serve deployment behind each lane (fast, priority, standard, exact).

It tokenizes the prompt, checks the context budget and the batch cap, drives the lane's engine
and streams coalesced ``delta`` events, then one ``done`` event with usage, timing and cost. The
lanes differ only by configuration: which engine (``ShardedLaneEngine`` or ``VLLMLaneEngine``),
its batch cap, its price, and for exact the fast model drafting for the full one.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from tokenizers import Tokenizer

from sharding.errors import PromptTooLong

from .. import metrics, telemetry
from ..config import LANE_CONFIGS, FastLaneConfig, TelemetryConfig, VLLMLaneConfig
from ..errors import Overloaded, to_event
from ..request import LaneRequest
from ..stream import coalesce
from .engine import EngineOutput, EngineRequest, LaneEngine
from .link import LinkServer

FAST = "fast"
PRIORITY = "priority"
STANDARD = "standard"
EXACT = "exact"
LANES = (FAST, PRIORITY, STANDARD, EXACT)
MIN_STREAM_INTERVAL_S = 0.005
"""The shortest coalescing window (the longest is the lane's ``stream_interval_ms``); in between
it adapts to what a streamed chunk costs Ray Serve (``serve.stream.coalesce``)."""


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
    """

    def __init__(self, lane: str, model_id: str, model_path: str, config: dict[str, Any],
                 telemetry_config: dict[str, Any] | None = None, draft_path: str | None = None) -> None:
        telemetry.setup(f"{lane}-lane")
        self.lane, self.model_id = lane, model_id
        self.tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
        self.config: FastLaneConfig | VLLMLaneConfig = LANE_CONFIGS[lane].model_validate(config)
        if lane == FAST:
            from .sharded_engine import ShardedLaneEngine

            self.engine: LaneEngine = ShardedLaneEngine(model_path, self.config, self.tokenizer,
                                                        TelemetryConfig.model_validate(telemetry_config or {}))
            self.cap = None
        else:
            from .vllm_engine import VLLMLaneEngine

            self.engine = VLLMLaneEngine(model_path, self.config, draft_path if lane == EXACT else None)
            self.cap = self.config.max_num_seqs if self.config.admission == "reject" else None
        self.in_flight = 0
        self.cancelled = 0
        self.link = LinkServer(self.generate)

    async def link_address(self) -> dict[str, Any]:
        """Where a front door's router streams from this replica directly (``serve.lanes.link``):
        replica id, host (this node's IP), port and the connection's secret."""
        import ray

        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        return await self.link.address(host)

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
        if self.cap is not None and self.in_flight >= self.cap:
            raise Overloaded(f"the {self.lane} lane's batch is full ({self.cap} sequences)",
                             retry_after=self.config.retry_after_s)
        ids = self.tokenizer.encode(request.prompt).ids
        n_prompt = len(ids)
        max_tokens = request.max_output_tokens or self.engine.max_len - n_prompt
        if n_prompt + max_tokens > self.engine.max_len or max_tokens < 1:
            raise PromptTooLong(f"the prompt has {n_prompt} tokens; with max_output_tokens {max_tokens} it "
                                f"exceeds the {self.engine.max_len}-token context of {self.model_id}")
        engine_request = EngineRequest(
            request_id=request.request_id, prompt_ids=ids, max_tokens=max_tokens,
            temperature=request.temperature, top_p=request.top_p, seed=request.seed, stop=list(request.stop),
            ignore_eos=request.ignore_eos, trace=trace.set_span_in_context(span) if span.is_recording() else None)
        self.in_flight += 1
        done = False
        try:
            yield {"type": "accepted", "input_tokens": n_prompt}
            n_out, seq, first, last, reason, queue_s, hops, spec = 0, 0, None, None, None, None, None, None
            cached = 0
            async for outs in coalesce(self.engine.generate(engine_request), self.config.stream_interval_ms / 1e3,
                                       min_interval_s=MIN_STREAM_INTERVAL_S, final=_is_last):
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
                if text:
                    yield {"type": "delta", "seq": seq, "text": text, "tokens": tokens}
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

    async def stats(self) -> dict[str, Any]:
        """This replica's load: requests in the engine (``running``), streams open here, and streams
        closed before their end (``cancelled``, since start); the fast lane's chip layout and
        prefix cache too (``parked`` slots, ``hits``, ``reused_tokens``)."""
        stats = {"lane": self.lane, "model": self.model_id, "running": self.engine.num_unfinished(),
                 "in_flight": self.in_flight, "cap": self.cap, "cancelled": self.cancelled}
        if self.lane == FAST:
            stats["layout"] = {"tp": self.engine.tp, "pp": self.engine.pp, "why": self.engine.layout_reason}
            stats["prefix_cache"] = await self.engine.prefix_stats()
        return stats

    async def check_health(self) -> None:
        """Serve's health check: raises once the engine has died (so the replica is replaced)."""
        await self.engine.check_health()

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


__all__ = ["Lane", "LANES", "FAST", "PRIORITY", "STANDARD", "EXACT", "EngineOutput"]
