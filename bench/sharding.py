"""Sharding benchmark: transports, then tokens/s and per-hop cost for tp x pp, against the planner.

``fastmode bench sharding [--model models/fast] [--steps 64] [--layouts 1x1,2x1,1x2,2x2]
[--transport actor_calls,compiled_graph] [--quick] [--json OUT]``

1. Bare transports: a 1 KiB tensor driver -> actor a -> actor b -> driver (compiled graph,
   chained actor calls, Ray Direct Transport over gloo).
2. For each transport and layout: one sequence decoding ``--steps`` tokens (batch 1, the fast lane's regime):
   per-user tokens/s (1 / median step), per-hop median seconds and bytes by stage pair, per-stage
   compute, and the planner's prediction for the same layout on ``cpu-core`` chips; then the
   planner's pick for as many chips against the fastest layout measured.

Ray starts locally with ``chip`` = 4 (one per shard of the largest layout); on this 2-core
machine layouts of more than 2 chips share cores, which the table says.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import ray
import torch
from tqdm import tqdm

from models import FAST
from sharding.chips import load_chip
from sharding.pipeline import ShardedModel
from sharding.planner import Footprint, plan, predict
from sharding.sampling import SamplingParams


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def _timed(fn, n: int) -> list[float]:
    fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def bare_transports(n: int = 200) -> dict[str, float]:
    """Median round trip (ms) driver -> a -> b -> driver per transport."""
    from ray.dag import InputNode
    from ray.experimental.collective import create_collective_group

    @ray.remote(num_cpus=0, resources={"chip": 1})
    class Echo:
        def f(self, x):
            return x

        @ray.method(tensor_transport="gloo")
        def f_direct(self, x):
            return x.clone()

    x = torch.zeros(256)
    a, b = Echo.remote(), Echo.remote()
    out = {"actor_calls": _median_ms(_timed(lambda: ray.get(b.f.remote(a.f.remote(x))), n))}
    with InputNode() as inp:
        graph = b.f.bind(a.f.bind(inp)).experimental_compile()
    out["compiled_graph"] = _median_ms(_timed(lambda: ray.get(graph.execute(x)), n))
    graph.teardown()
    create_collective_group([a, b], backend="torch_gloo")
    out["direct_transport_gloo"] = _median_ms(_timed(lambda: ray.get(b.f.remote(a.f_direct.remote(x))), n // 2))
    for actor in (a, b):
        ray.kill(actor)
    return out


def layout_run(path: Path, tp: int, pp: int, steps: int, transport: str) -> dict:
    """One sequence, ``steps`` decode steps, after a warm-up request."""
    prompt = [0] + list(range(3, 26))
    with ShardedModel.from_pretrained(path, tp=tp, pp=pp, num_slots=1, transport=transport) as m:
        for _ in range(2):  # warm-up, then measured
            m.add("r", prompt, SamplingParams(max_tokens=steps + 1, ignore_eos=True))
            m.step()  # prefill
            step_s, compute_s, hops = [], [], {}
            while m.has_work:
                t0 = time.perf_counter()
                m.step()
                step_s.append(time.perf_counter() - t0)
                compute_s.append(sum(m.last_result.stage_seconds))
                for h in m.last_hops:
                    key = f"{h.src_stage}->{h.dst_stage}"
                    hops.setdefault(key, {"seconds": [], "bytes": h.bytes})["seconds"].append(h.seconds)
    return {
        "tp": tp, "pp": pp, "transport": transport,
        "tokens_per_s": 1e3 / _median_ms(step_s),
        "step_ms": _median_ms(step_s),
        "compute_ms": _median_ms(compute_s),
        "hops": {k: {"median_ms": _median_ms(v["seconds"]), "bytes": v["bytes"], "count": len(v["seconds"])}
                 for k, v in sorted(hops.items())},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sharding", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=FAST)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--layouts", default="1x1,2x1,1x2,2x2")
    p.add_argument("--transport", default="actor_calls,compiled_graph", help="comma-separated: actor_calls "
                   "(the fast lane's default), compiled_graph (default: both)")
    p.add_argument("--no-bare", action="store_true", help="skip the bare transport comparison")
    p.add_argument("--quick", action="store_true", help="layouts 1x1,1x2, 16 steps, no bare transports")
    p.add_argument("--json", type=Path)
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = p.parse_args(argv)
    if args.quick:
        args.layouts, args.steps, args.no_bare, args.transport = "1x1,1x2", 16, True, "actor_calls"
    layouts = [tuple(int(v) for v in s.split("x")) for s in args.layouts.split(",")]
    transports = [t.strip() for t in args.transport.split(",") if t.strip()]
    if not transports or set(transports) - {"actor_calls", "compiled_graph"}:
        p.error(f"--transport: choose from actor_calls, compiled_graph; got {args.transport!r}")
    chips = max(tp * pp for tp, pp in layouts)
    ray.init(address="local", resources={"chip": chips}, num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    result: dict = {"model": str(args.model), "cores": os.cpu_count(), "steps": args.steps,
                    "transports": transports, "date": time.strftime("%Y-%m-%d %H:%M"),
                    "command": "fastmode bench sharding " + " ".join(argv), "platform": platform.platform()}
    try:
        if not args.no_bare:
            result["bare_round_trip_ms"] = bare_transports()
            print("bare round trip driver->a->b->driver (ms):",
                  ", ".join(f"{k} {v:.2f}" for k, v in result["bare_round_trip_ms"].items()))
        config = json.loads((args.model / "config.json").read_text())
        footprint = Footprint.from_config(config, "float32")
        chip = load_chip("cpu-core")
        rows = []
        runs = [(t, tp, pp) for t in transports for tp, pp in layouts]
        for transport, tp, pp in tqdm(runs, desc="sharding layouts", unit="layout", file=sys.stderr):
            time.sleep(1)  # let the previous layout's chips come back
            row = layout_run(args.model, tp, pp, args.steps, transport)
            row["predicted_tokens_per_s"] = predict(footprint, chip, tp, pp).tokens_per_s
            row["measured_over_predicted"] = row["tokens_per_s"] / row["predicted_tokens_per_s"]
            rows.append(row)
            hops = "  ".join(f"{k}: {v['median_ms']:.2f} ms {v['bytes']} B" for k, v in row["hops"].items())
            shared = " (chips share cores)" if tp * pp > (os.cpu_count() or 1) else ""
            print(f"{tp}x{pp} {transport}{shared}: {row['tokens_per_s']:.0f} tokens/s (planner {row['predicted_tokens_per_s']:.0f}), "
                  f"step {row['step_ms']:.2f} ms, compute {row['compute_ms']:.2f} ms | {hops}")
        result["layouts"] = rows
        best, _ = plan(config, chip, chips)  # the planner's pick for this many chips, against the fastest measured
        fastest = max(rows, key=lambda r: r["tokens_per_s"])
        result["planner_choice"] = {"chips": chips, "tp": best.tp, "pp": best.pp,
                                    "fastest_measured": {"tp": fastest["tp"], "pp": fastest["pp"],
                                                         "transport": fastest["transport"]}}
    finally:
        ray.shutdown()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
