"""Could vLLM's own request priority replace the priority lane's dedicated low-batch engine?

The alternative to fastmode's priority lane (its own engine, ``max_num_seqs: 2``) is one engine
for both tiers with vLLM's ``scheduling_policy="priority"``: priority requests jump the queue
(and preempt a running standard request when the batch is full). This measures, on one vLLM
``AsyncLLM`` in process on the full checkpoint with the standard lane's settings, while
``--background`` standard streams keep the batch full (``max_num_seqs`` of them, and a queue
behind):

- a probe request with ``priority=0`` (first) and with the background's ``priority=1`` (FCFS
  order), one after the other: time to first token and decode tokens/s per user;
- the background streams' own decode tokens/s per user, over the same window.

If the probe decodes at the background's speed, vLLM's priority buys a place in the queue, not
speed per user: the priority lane's per-user speed needs its own small batch.

Usage: python -m bench.priority_policy [--background 40] [--tokens 128] [--probes 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

from bench.ray_serve_llm import engine_kwargs
from models import TEST_FULL
from serve.config import StandardLaneConfig

PROMPT = "import os\n\n\ndef read_lines(path):\n"


async def _stream(engine, ids: list[int], params, priority: int) -> dict:
    from vllm import TokensPrompt

    t0 = time.perf_counter()
    first = last = None
    n = 0
    async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), params, uuid.uuid4().hex,
                                     priority=priority):
        now = time.perf_counter()
        first = first or now
        last = now
        n += len(out.outputs[0].token_ids)
    return {"ttft_s": first - t0, "decode_tokens_per_s": (n - 1) / (last - first) if n > 1 else None}


async def _run(background: int, tokens: int, probes: int) -> dict:
    from transformers import AutoTokenizer
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    lane = StandardLaneConfig()
    ids = AutoTokenizer.from_pretrained(TEST_FULL)(PROMPT).input_ids
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(TEST_FULL), scheduling_policy="priority",
                                                       **engine_kwargs(lane, TEST_FULL)))
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    try:
        await _stream(engine, ids, params, 1)  # warm-up
        stop = asyncio.Event()
        bg_results: list[dict] = []

        async def worker():
            while not stop.is_set():
                bg_results.append(await _stream(engine, ids, params, 1))

        workers = [asyncio.create_task(worker()) for _ in range(background)]
        await asyncio.sleep(2.0)  # the batch fills and a queue forms
        probe = {"priority 0 (first)": [], "priority 1 (FCFS, as the background)": []}
        for _ in range(probes):
            for name, prio in (("priority 0 (first)", 0), ("priority 1 (FCFS, as the background)", 1)):
                probe[name].append(await _stream(engine, ids, params, prio))
        stop.set()
        await asyncio.gather(*workers)
    finally:
        engine.shutdown()
    med = lambda rows, k: statistics.median(r[k] for r in rows if r[k] is not None)  # noqa: E731
    return {"probe": {n: {"ttft_s": med(rows, "ttft_s"), "decode_tokens_per_s": med(rows, "decode_tokens_per_s"),
                          "n": len(rows)} for n, rows in probe.items()},
            "background": {"decode_tokens_per_s": med(bg_results, "decode_tokens_per_s"), "n": len(bg_results)},
            "settings": {"background_streams": background, "max_num_seqs": lane.max_num_seqs, "tokens": tokens,
                         "probes": probes, "scheduling_policy": "priority", "model": "models/full"}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.priority_policy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--background", type=int, default=40, help="standard streams kept open (default 40)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--probes", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    doc = asyncio.run(_run(args.background, args.tokens, args.probes))
    doc["command"] = "python -m bench.priority_policy " + " ".join(argv if argv is not None else sys.argv[1:])
    doc["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for name, r in doc["probe"].items():
        print(f"probe {name}: TTFT {r['ttft_s'] * 1e3:.0f} ms, {r['decode_tokens_per_s']:.1f} tok/s per user")
    print(f"background ({args.background} streams): {doc['background']['decode_tokens_per_s']:.1f} tok/s per user")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
