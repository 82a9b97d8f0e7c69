"""What tracing costs the fast lane: decode tokens/s with tracing off and on (default sampling).

Runs the fast lane's own engine (``ShardedLaneEngine``, by default tp=1 x pp=2 so that every step
has hops to trace) in this process, alternating requests without and with a recording lane span, so that both see
the same machine state. "On" is what a traced request costs in the lane's process: step spans for
the prefill, the first 8 decode steps and every 64th (``telemetry`` defaults), a span per hop of
those steps, and hop totals over every step, exported by a ``BatchSpanProcessor`` (to a file
here, as ``FASTMODE_TRACE_FILE`` does; an OTLP exporter does the same work in its own thread).

Usage: python -m bench.tracing_cost [--tokens 256] [--pairs 6] [--tp 1] [--pp 2] [--no-compile] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

import ray
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from tokenizers import Tokenizer

from models import TEST_FAST
from serve.config import FastLaneConfig, TelemetryConfig
from serve.lanes.engine import EngineRequest
from serve.lanes.sharded_engine import ShardedLaneEngine
from serve.telemetry import JsonFileExporter, tracer


async def one(engine: ShardedLaneEngine, rid: str, tokens: int, traced: bool) -> float:
    span = tracer().start_span("bench") if traced else None
    ctx = trace.set_span_in_context(span) if traced else None
    n, first = 0, None
    async for out in engine.generate(EngineRequest(rid, [0, 100, 200], tokens, temperature=0, ignore_eos=True,
                                                   trace=ctx)):
        n += len(out.token_ids)
        first = first or time.perf_counter()
    if span is not None:
        span.end()
    return (n - 1) / (time.perf_counter() - first)


async def measure(engine: ShardedLaneEngine, tokens: int, pairs: int) -> dict[str, list[float]]:
    await one(engine, "warm", 16, True)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for i in range(pairs):
        for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
            rates[mode].append(await one(engine, f"{mode}-{i}", tokens, mode == "on"))
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=2, help="stages (default 2: hops to trace)")
    ap.add_argument("--no-compile", action="store_true", help="eager, whatever the lane's config says (smoke runs)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    spans_file = os.path.join(tempfile.mkdtemp(), "spans.jsonl")
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(JsonFileExporter(spans_file)))
    trace.set_tracer_provider(provider)
    cfg = FastLaneConfig(tp=args.tp, pp=args.pp, **({"compile": False} if args.no_compile else {}))
    ray.init(address="local", resources={"chip": cfg.tp * cfg.pp}, include_dashboard=False, log_to_driver=False)
    try:
        engine = ShardedLaneEngine(TEST_FAST, cfg, Tokenizer.from_file(str(TEST_FAST / "tokenizer.json")), TelemetryConfig())
        try:
            rates = asyncio.run(measure(engine, args.tokens, args.pairs))
        finally:
            engine.shutdown()
    finally:
        ray.shutdown()
        provider.shutdown()
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    spans = sum(len(ss["spans"]) for line in open(spans_file) for rs in json.loads(line)["resourceSpans"]
                for ss in rs["scopeSpans"])
    result = {"tokens": args.tokens, "pairs": args.pairs, "layout": {"tp": cfg.tp, "pp": cfg.pp,
              "transport": cfg.transport, "compile": cfg.compile}, "tokens_per_s": {"off": off, "on": on}, "runs": rates,
              "slowdown": 1 - on / off, "spans_exported": spans, "date": time.strftime("%Y-%m-%d %H:%M"),
              "command": "python -m bench.tracing_cost " + " ".join(sys.argv[1:] if argv is None else argv)}
    print(f"fast lane tp={cfg.tp} x pp={cfg.pp}: tracing off {off:.0f} tok/s, on {on:.0f} tok/s "
          f"(median of {args.pairs}): {100 * (1 - on / off):+.1f}% slower; {spans} spans exported")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
