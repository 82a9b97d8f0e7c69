"""Sharding benchmark: hop transports, then tokens/s and per-hop cost of the ring for tp x pp,
against the planner.

``fastmode bench sharding [--model models/fast] [--steps 256] [--layouts 1x1,2x1,1x2,2x2]
[--eager] [--quick] [--json OUT]``

1. Bare transports, the candidates for a per-token hop: a 1 KiB tensor driver -> actor a ->
   actor b -> driver over chained actor calls, a Ray compiled graph, Ray Direct Transport (gloo),
   and fastmode's TCP links (``sharding.transport``) with and without the spin window; then the CPU
   each pair of idle actors uses over 2 s (a compiled graph's readers spin; a link sleeps).
2. For each layout the model's shape allows (the others are skipped with the executor's reason,
   ``skipped_layouts``): the ring (``sharding.ring``, compiled unless ``--eager``) decoding one sequence
   of ``--steps`` tokens (batch 1, the fast lane's regime), ``--trials`` times, the median trial
   reported: per-user tokens/s (tokens / wall time),
   the head's median step, per-hop median seconds and bytes by stage pair, per-stage compute, and
   the planner's prediction for the same layout on ``cpu-core`` chips; then the planner's pick for
   as many chips against the fastest layout measured.

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

from sharding.chips import load_chip
from sharding.config import ModelConfig
from sharding.errors import InvalidLayout
from sharding.placement import stage_layers
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


def _cpu_seconds(actors, wait_s: float = 2.0) -> list[float]:
    """CPU seconds (all threads) each actor's process used over ``wait_s`` of idling."""
    ask = lambda: ray.get([x.__ray_call__.remote(lambda self: time.process_time()) for x in actors])  # noqa: E731
    before = ask()
    time.sleep(wait_s)
    return [(b - a) / wait_s for a, b in zip(before, ask(), strict=True)]


def bare_transports(n: int = 200) -> dict[str, dict[str, float]]:
    """Per transport: median round trip (ms) driver -> a -> b -> driver, and each idle actor's CPU share."""
    from ray.dag import InputNode
    from ray.experimental.collective import create_collective_group

    from sharding.transport import Link, accept, listen

    @ray.remote(num_cpus=0, resources={"chip": 1})
    class Echo:
        def f(self, x):
            return x

        @ray.method(tensor_transport="gloo")
        def f_direct(self, x):
            return x.clone()

        def listen(self):
            self.server = listen("127.0.0.1")
            return self.server.getsockname()[1]

        def relay(self, port: int, spin_s: float):
            import threading

            out = Link.connect("127.0.0.1", port, hello="x")

            def run():
                (inbound,) = accept(self.server, 1).values()
                inbound.spin_s = spin_s
                try:
                    while True:
                        meta, tensors = inbound.recv()
                        out.send(meta, tensors)
                except Exception:  # noqa: BLE001 - the driver closed the ring
                    return

            threading.Thread(target=run, daemon=True).start()

    x = torch.zeros(256)
    out = {}
    a, b = Echo.remote(), Echo.remote()
    out["actor_calls"] = {"round_trip_ms": _median_ms(_timed(lambda: ray.get(b.f.remote(a.f.remote(x))), n))}
    out["actor_calls"]["idle_cpu"] = max(_cpu_seconds([a, b]))
    with InputNode() as inp:
        graph = b.f.bind(a.f.bind(inp)).experimental_compile()
    out["compiled_graph"] = {"round_trip_ms": _median_ms(_timed(lambda: ray.get(graph.execute(x)), n)),
                             "idle_cpu": max(_cpu_seconds([a, b]))}
    graph.teardown()
    create_collective_group([a, b], backend="torch_gloo")
    out["direct_transport_gloo"] = {"round_trip_ms": _median_ms(_timed(lambda: ray.get(b.f.remote(a.f_direct.remote(x))), n // 2))}
    for actor in (a, b):
        ray.kill(actor)
    for name, spin_s in (("tcp_link", 0.002), ("tcp_link_no_spin", 0.0)):
        a, b = Echo.remote(), Echo.remote()
        server = listen("127.0.0.1")
        pa, pb = ray.get([a.listen.remote(), b.listen.remote()])
        ray.get([a.relay.remote(pb, spin_s), b.relay.remote(server.getsockname()[1], spin_s)])
        to_a = Link.connect("127.0.0.1", pa, hello="driver")
        (back,) = accept(server, 1).values()
        back.spin_s = spin_s

        def trip():
            to_a.send(None, [x])
            back.recv()

        out[name] = {"round_trip_ms": _median_ms(_timed(trip, n * 5)), "idle_cpu": max(_cpu_seconds([a, b]))}
        to_a.close()
        back.close()
        server.close()
        for actor in (a, b):
            ray.kill(actor)
    return out


def layout_run(path: Path, tp: int, pp: int, steps: int, compile_: bool, trials: int = 3) -> dict:
    """One sequence of ``steps`` tokens through the ring, ``trials`` times after a warm-up; the
    figures of the median trial (a trial of a fast layout lasts a quarter of a second, so one
    trial is at the mercy of whatever else this shared machine does at that moment)."""
    prompt = [0] + list(range(3, 26))
    runs = []
    with ShardedModel.from_pretrained(path, tp=tp, pp=pp, num_slots=2, compile=compile_,
                                      max_len=min(512, len(prompt) + steps + 8)) as m:
        m.warmup()
        time.sleep(1)
        for trial in range(trials):
            m.add(f"r{trial}", prompt, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
            infos, n = [], 0
            start = time.perf_counter()
            while m.has_work:
                n += len(m.step())
                infos += m.last_infos
            runs.append((n / (time.perf_counter() - start), infos[1:]))  # the prefill step aside
    tokens_per_s, decode = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    hops: dict[str, dict] = {}
    for info in decode:
        for h in info.hops:
            key = f"{h.src_stage}->{h.dst_stage}"
            hops.setdefault(key, {"seconds": [], "bytes": h.bytes})["seconds"].append(h.seconds)
    return {
        "tp": tp, "pp": pp, "transport": "tcp", "compiled": compile_,
        "tokens_per_s": tokens_per_s, "trials_tokens_per_s": [r[0] for r in runs],
        "step_ms": _median_ms([(i.end_ns - i.start_ns) / 1e9 for i in decode]),
        "compute_ms": _median_ms([sum(i.stage_seconds) for i in decode]),
        "hops": {k: {"median_ms": _median_ms(v["seconds"]), "bytes": v["bytes"], "count": len(v["seconds"])}
                 for k, v in sorted(hops.items())},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sharding", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="checkpoint (default: the fast model, bench.pair)")
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--layouts", default="1x1,2x1,1x2,2x2")
    p.add_argument("--eager", action="store_true", help="run the chips without torch.compile")
    p.add_argument("--no-bare", action="store_true", help="skip the bare transport comparison")
    p.add_argument("--trials", type=int, default=3, help="sequences per layout; the median one is reported")
    p.add_argument("--quick", action="store_true", help="layouts 1x1,1x2, 16 steps, no bare transports")
    p.add_argument("--json", type=Path)
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = p.parse_args(argv)
    if args.quick:
        args.layouts, args.steps, args.no_bare, args.eager, args.trials = "1x1,1x2", 32, True, True, 1
    if args.model is None:
        from bench import pair

        args.model = pair.fast()
    layouts = [tuple(int(v) for v in s.split("x")) for s in args.layouts.split(",")]
    # A layout the model's shape does not allow (SmolLM2's 9 heads split by no tp of 2) is skipped
    # with the executor's own reason, not run.
    model_config = ModelConfig.from_pretrained(args.model)
    skipped = {}
    for tp, pp in layouts:
        try:
            stage_layers(model_config, tp, pp)
        except InvalidLayout as e:
            skipped[f"{tp}x{pp}"] = str(e)
    layouts = [(tp, pp) for tp, pp in layouts if f"{tp}x{pp}" not in skipped]
    if not layouts:
        print(f"bench sharding: no layout of {args.layouts} fits {args.model}: {skipped}", file=sys.stderr)
        return 2
    chips = max(tp * pp for tp, pp in layouts)
    ray.init(address="local", resources={"chip": chips}, num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    result: dict = {"model": str(args.model), "cores": os.cpu_count(), "steps": args.steps,
                    "transports": ["tcp"], "compiled": not args.eager, "date": time.strftime("%Y-%m-%d %H:%M"),
                    "command": "fastmode bench sharding " + " ".join(argv), "platform": platform.platform(),
                    "skipped_layouts": skipped}
    try:
        if not args.no_bare:
            result["bare_round_trip_ms"] = bare_transports()
            print("bare round trip driver->a->b->driver:", ", ".join(
                f"{k} {v['round_trip_ms']:.3f} ms" + (f" (idle actor {100 * v['idle_cpu']:.0f}% of a core)" if "idle_cpu" in v else "")
                for k, v in result["bare_round_trip_ms"].items()))
        config = json.loads((args.model / "config.json").read_text())
        footprint = Footprint.from_config(config, "float32")
        chip = load_chip("cpu-core")
        rows = []
        for tp, pp in tqdm(layouts, desc="sharding layouts", unit="layout", file=sys.stderr):
            time.sleep(1)  # let the previous layout's chips come back
            row = layout_run(args.model, tp, pp, args.steps, not args.eager, args.trials)
            transport = "tcp" + ("" if args.eager else ", compiled")
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
