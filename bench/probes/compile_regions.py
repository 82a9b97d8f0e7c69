"""The exact lane's compile with one graph per model against one region per layer (``compile_regions``).

Two measurements on the default pair (``bench.pair``; ``--full``/``--fast`` another), each with
its own empty inductor cache (``TORCHINDUCTOR_CACHE_DIR`` under a temporary folder) and one torch
thread, as the lane runs:

- ``step``: the full model alone (packed weights, a cache of 1,024 tokens or its context), compiled both ways in one
  process; the seconds each takes to compile batch-1 decode at a few positions, then the median
  time of a batch-1 decode step over 60 positions, the two interleaved ``--repeats`` times.
- ``warm-up`` (``--warm-up whole,regions``): the exact lane's ``SpeculativeEngine`` with its default
  settings (two slots, k = 3, prefix cache, packed weights, the draft's cut head) and
  ``SpeculativeEngine.warm_up``'s seconds and graphs, each variant in a subprocess of its own.
  ``--layers N`` keeps the target's first N layers (a shorter run; the tokens are then nobody's).

Usage: python -m bench.probes.compile_regions [--repeats 5] [--warm-up whole,regions] [--layers N]
                                              [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def step_times(full: Path, repeats: int) -> dict:
    """Compile seconds and median batch-1 decode step (ms) of the full model, whole and in regions."""
    from sharding.batch import Rows
    from sharding.stage import StageRunner
    from sharding.weights import load_model

    def step(r: StageRunner, pos: int) -> None:
        r.logits([Rows(torch.ones(1, 1, dtype=torch.long), torch.tensor([[pos]]), torch.tensor([0]),
                       torch.tensor([0]), pos + 1)])

    runners, out = {}, {}
    with torch.inference_mode():
        for name, regions in (("whole", False), ("regions", True)):
            model = load_model(full)
            r = StageRunner(model, num_slots=2, max_len=min(1024, model.config.context), compile=True,
                            compile_regions=regions, packed_weights=True)
            t0 = time.perf_counter()
            for pos in (100, 101, 102, 150, 170, 200, 300):  # static, then the span symbolic
                step(r, pos)
            runners[name], out[name] = r, {"compile_s": time.perf_counter() - t0, "step_ms": []}
        for _ in range(repeats):
            for name, r in runners.items():
                t0 = time.perf_counter()
                for pos in range(100, 160):
                    step(r, pos)
                out[name]["step_ms"].append((time.perf_counter() - t0) / 60 * 1e3)
    for v in out.values():
        v["step_ms"] = statistics.median(v["step_ms"])
    out["regions_over_whole"] = out["regions"]["step_ms"] / out["whole"]["step_ms"]
    return out


def warm_up(full: Path, fast: Path, regions: bool, layers: int | None) -> dict:
    """The exact engine's warm-up with the lane's settings (this process: run it in a fresh one)."""
    from torch._dynamo.utils import counters

    from serve.config import ExactLaneConfig
    from sharding.draft_vocab import vocab_ids
    from sharding.speculative import SpeculativeEngine
    from sharding.weights import load_model

    c = ExactLaneConfig()
    target, draft = load_model(full), load_model(fast)
    for i in range(layers if layers is not None else len(target.model.layers), len(target.model.layers)):
        del target.model.layers[str(i)]
    ids = vocab_ids(c.draft_vocab, fast, draft.config.vocab_size, target.config.eos_token_ids)
    t0 = time.perf_counter()
    engine = SpeculativeEngine(target, draft, num_slots=c.max_num_seqs, k=c.num_speculative_tokens,
                               adaptive=c.adaptive_k, compile=True, compile_regions=regions,
                               prefix_cache=c.prefix_cache, packed_weights=True,
                               draft_vocab=None if ids is None else torch.tensor(ids))
    engine.warm_up()
    return {"seconds": time.perf_counter() - t0, "graphs": counters["stats"]["unique_graphs"],
            "target_layers": len(target.model.layers)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.probes.compile_regions",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warm-up", default="",
                    help="whole,regions: also time the exact engine's warm-up each way")
    ap.add_argument("--layers", type=int, help="keep the target's first N layers in the warm-up runs")
    ap.add_argument("--full", type=Path, help="the full model (default: the default pair's, bench.pair)")
    ap.add_argument("--fast", type=Path, help="the draft (default: the default pair's student)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", choices=["whole", "regions"], help=argparse.SUPPRESS)  # a warm-up subprocess
    args = ap.parse_args([str(a) for a in argv] if argv is not None else None)
    torch.set_num_threads(1)
    if args.full is None or args.fast is None:
        from bench import pair
        args.full, args.fast = args.full or pair.full(), args.fast or pair.fast()
    if args.one:
        print(json.dumps(warm_up(args.full, args.fast, args.one == "regions", args.layers)))
        return 0
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            step = step_times(args.full, args.repeats)
        finally:
            if before is None:
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    doc: dict = {"full": str(args.full), "fast": str(args.fast), "step": step}
    print(f"step: whole {step['whole']['step_ms']:.2f} ms, regions {step['regions']['step_ms']:.2f} ms "
          f"({step['regions_over_whole']:.3f}x); compile {step['whole']['compile_s']:.0f} s "
          f"against {step['regions']['compile_s']:.0f} s", flush=True)
    for name in [w for w in args.warm_up.split(",") if w]:
        with tempfile.TemporaryDirectory() as cache:
            cmd = [sys.executable, "-m", "bench.probes.compile_regions", "--one", name,
                   "--full", str(args.full), "--fast", str(args.fast)]
            cmd += ["--layers", str(args.layers)] if args.layers is not None else []
            run = subprocess.run(cmd, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache},
                                 capture_output=True, text=True, check=True)
        doc[f"warm_up_{name}"] = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"warm-up {name}: {doc[f'warm_up_{name}']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
