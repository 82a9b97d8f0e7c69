"""``python -m bench.vllm_executor``: a vLLM lane's engine in process, per-user decode speed and CPU per
token, to compare vLLM's executors (``executor: uni`` against ``mp``) or the exact lane's draft count k.

One ``VLLMLaneEngine`` as the lane builds it, ``--streams`` concurrent greedy requests of ``--tokens``
tokens (``ignore_eos``), ``--rounds`` times after an 8-token warm-up; per-user tokens/s after each
request's first token (median), aggregate tokens/s, and the CPU time of this process and its
children (vLLM's engine processes) per output token. Run each setting in its own process, alone on
the machine, alternating settings: ``docs/decisions/`` ("vLLM's executor") has the figures.

    python -m bench.vllm_executor --lane priority --streams 1 --executor uni
    python -m bench.vllm_executor --lane exact --k 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import psutil


def cpu_seconds() -> float:
    """User and system CPU of this process and every process under it."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            c = p.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


async def measure(engine, prompt: list[int], streams: int, tokens: int, rounds: int) -> dict:
    from serve.lanes.engine import EngineRequest

    async def one(rid: str, n: int) -> tuple[float, int]:
        got, first = 0, None
        async for out in engine.generate(EngineRequest(rid, prompt, n, temperature=0, ignore_eos=True)):
            got += len(out.token_ids)
            first = first or time.perf_counter()
        return (got - 1) / (time.perf_counter() - first), got

    await one("warm", 8)
    rates, total = [], 0
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    for r in range(rounds):
        for rate, got in await asyncio.gather(*(one(f"{r}-{s}", tokens) for s in range(streams))):
            rates.append(rate)
            total += got
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return {"per_user_tokens_per_s_p50": statistics.median(rates), "aggregate_tokens_per_s": total / seconds,
            "cpu_ms_per_token": 1e3 * cpu / total, "output_tokens": total}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.vllm_executor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lane", choices=("priority", "standard", "exact"), default="priority")
    ap.add_argument("--executor", choices=("auto", "uni", "mp"), default="auto")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--k", type=int, help="the exact lane's num_speculative_tokens (default: the config's)")
    ap.add_argument("--model", type=Path, help="the full checkpoint (default: the test pair's)")
    ap.add_argument("--dtype", help="vLLM's dtype (default: the lane config's)")
    ap.add_argument("--threads", type=int, help="vLLM's CPU threads (VLLM_CPU_OMP_THREADS_BIND=0-N-1)")
    args = ap.parse_args(argv)
    if args.threads:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"

    from transformers import AutoTokenizer

    from bench.targets import PROMPT
    from models import TEST_FAST, TEST_FULL
    from serve.config import LANE_CONFIGS
    from serve.lanes.vllm_engine import VLLMLaneEngine

    settings = ({"executor": args.executor} | ({"num_speculative_tokens": args.k} if args.k else {})
                | ({"dtype": args.dtype} if args.dtype else {}))
    full = args.model or TEST_FULL
    if args.lane != "exact" and args.streams > LANE_CONFIGS[args.lane].model_fields["max_num_seqs"].default:
        settings["max_num_seqs"] = args.streams  # every stream in the batch at once
    config = LANE_CONFIGS[args.lane](**settings)
    engine = VLLMLaneEngine(full, config, draft_path=TEST_FAST if args.lane == "exact" else None)
    try:
        prompt = AutoTokenizer.from_pretrained(full)(PROMPT).input_ids
        result = asyncio.run(measure(engine, prompt, args.streams, args.tokens, args.rounds))
    finally:
        engine.shutdown()
    print(json.dumps({"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, **{k: round(v, 2) for k, v in result.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
