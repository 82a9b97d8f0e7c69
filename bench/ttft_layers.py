"""The fast lane's first token through each layer of the front door's path, in one process.

Builds the fast lane's ring here (its layout and options: ``ring_options``) and times a greedy first
token of ``--tokens`` output tokens (first output, p50) on the same prompt through:

- ``blocking``: the ring's own blocking client (what ``fastmode bench gateway`` holds served first
  tokens against);
- ``head_client``: ``HeadClient``, the asyncio client a front door streams from the head with;
- ``lane``: a ``Lane`` around that client, as a front door's own fast lane runs it (tokenize, span,
  bookkeeping; outputs passed on as they come);
- ``lane_coalesced``: the same ``Lane`` coalescing its outputs, as a lane replica does.

Blocks of ``--per-block`` of each alternate over ``--rounds`` rounds, so that the machine's drift
hits all alike. What the front door adds beyond ``lane`` (WebSocket, session, router, two more
sends and wake-ups) is the served figure minus this one (``bench.gateway``, ``bench.ttft_split``).

Usage: python -m bench.ttft_layers [--rounds 6] [--per-block 20] [--tokens 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench.in_process import TTFT_PROMPT, fast_ring
from bench.rounds import round_order


async def _layers(m, prompt: list[int], tokens: int, rounds: int, per_block: int) -> dict[str, list[float]]:
    from models import TEST_FAST
    from serve.lanes.engine import EngineRequest
    from serve.lanes.head_client import HeadClient
    from serve.lanes.lane import FAST as FAST_LANE
    from serve.lanes.lane import Lane
    from serve.request import GenerateRequest
    from sharding.sampling import SamplingParams

    client = HeadClient(m.config, m.max_len, m.client_address, m.secret, m.tokenizer, {})
    await client.connect()
    lane = Lane(FAST_LANE, "fastmode-fast", str(TEST_FAST), {}, engine=client)
    n = 0

    def rid() -> str:
        nonlocal n
        n += 1
        return f"layers-{n}"

    async def blocking() -> float:  # the ring's blocking client (it holds the loop: nothing else runs now)
        t = time.perf_counter()
        m.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
        return time.perf_counter() - t

    async def head_client() -> float:
        t, first = time.perf_counter(), None
        async for _ in client.generate(EngineRequest(rid(), prompt, tokens, temperature=0, ignore_eos=True)):
            first = first or time.perf_counter() - t
        return first

    async def through_lane(coalesced: bool) -> float:
        lane.owns_engine = coalesced  # a lane that owns its engine coalesces (Lane._outputs)
        request = GenerateRequest.parse({"model": "m", "input": TTFT_PROMPT, "max_output_tokens": tokens,
                                         "temperature": 0, "ignore_eos": True}).to_lane(rid())
        t, first = time.perf_counter(), None
        async for event in lane.generate(request):
            if event["type"] == "delta" and first is None:
                first = time.perf_counter() - t
        lane.owns_engine = False
        return first

    sides = {"blocking": blocking, "head_client": head_client, "lane": lambda: through_lane(False),
             "lane_coalesced": lambda: through_lane(True)}
    for measure in sides.values():  # each path's first requests (the prompt's prefix cached from then on)
        for _ in range(2):
            await measure()
    out: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for r in range(rounds):
            for name in round_order(list(sides), r):
                for _ in range(per_block):
                    out[name].append(await sides[name]())
    finally:
        client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="python -m bench.ttft_layers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-block", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=4, help="output tokens per request (the first is timed)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="compile the ring as the lane does (--no-compile: eager, a smoke run)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import uvloop

    started = time.strftime("%Y-%m-%d %H:%M")
    with fast_ring(args.compile) as ring:
        samples = uvloop.run(_layers(ring.model, ring.prompt, args.tokens, args.rounds, args.per_block))
    p50 = {name: statistics.median(xs) * 1e3 for name, xs in samples.items()}
    for name, ms in p50.items():
        print(f"{name:<15} first token p50 {ms:6.3f} ms ({len(samples[name])} requests)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(
            {"date": started, "command": "python -m bench.ttft_layers " + " ".join(argv),
             "layout": ring.layout,
             "options": {k: f"{len(v)} ids" if k == "vocab" and v else str(v) for k, v in ring.options.items()},
             "tokens": args.tokens, "rounds": args.rounds, "per_block": args.per_block, "p50_ms": p50,
             "samples_s": samples}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
