"""The fast lane's first token after the ring has been idle: what a request pays for the gap before it.

Builds the fast lane's ring here (``bench.in_process.fast_ring``: its layout and options) and sends
one greedy request after another through ``HeadClient`` (the client a front door streams from the
head with), the client sleeping ``gap`` before each, for each of ``--gaps`` (ms), in blocks of
``--per-block`` alternated over ``--rounds`` rounds. Per gap, p50 of: the first token (client clock,
send to first output), and its parts as the head stamps them: send -> the prefill step's start
(wake-up, admission), the step itself (of it, the model's compute) and the step's end -> the
client.

Why: on a VM whose idle cores halt and whose caches other tenants share, a step right after
another runs at the machine's best; after a few milliseconds of nothing it runs about twice as
long, although nothing about the request changed. Every served first token follows such a gap (the
last response's way out to the client and the next request's way in), so this is how much of the
served first token's distance from a back-to-back engine figure is the ring's, not the front
door's (docs/decisions/).

Usage: python -m bench.ttft_idle [--gaps 0,1,2,5,20] [--rounds 4] [--per-block 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from bench.in_process import fast_ring
from bench.rounds import round_order


async def _measure(ring, gaps_s: list[float], rounds: int, per_block: int, tokens: int) -> dict[str, list[tuple]]:
    from serve.lanes.engine import EngineRequest
    from serve.lanes.head_client import HeadClient

    m = ring.model
    seen: list[tuple[int, list]] = []

    class Recording(HeadClient):
        def _deliver(self, outputs, infos, report):
            seen.append((time.time_ns(), infos))
            super()._deliver(outputs, infos, report)

    client = Recording(m.config, m.max_len, m.client_address, m.secret, m.tokenizer, {})
    await client.connect()
    n = 0

    async def once(gap: float) -> tuple:
        nonlocal n
        n += 1
        if gap:
            time.sleep(gap)  # nothing runs here meanwhile: the ring and this process both idle
        seen.clear()
        sent, sent_ns, first = time.perf_counter(), time.time_ns(), None
        async for _ in client.generate(EngineRequest(f"idle-{n}", ring.prompt, tokens, temperature=0,
                                                     ignore_eos=True)):
            first = first or time.perf_counter() - sent
        got_ns, infos = seen[0]
        step = infos[0]
        return (first, (step.start_ns - sent_ns) / 1e9, (step.end_ns - step.start_ns) / 1e9,
                step.stage_seconds[0], (got_ns - step.end_ns) / 1e9)

    for gap in gaps_s:  # the prompt's first runs (its prefix is cached from then on, as on the lane)
        await once(gap)
    out: dict[str, list[tuple]] = {str(g): [] for g in gaps_s}
    try:
        for r in range(rounds):
            for gap in round_order(gaps_s, r):
                for _ in range(per_block):
                    out[str(gap)].append(await once(gap))
    finally:
        client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="python -m bench.ttft_idle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gaps", default="0,1,2,5,20", help="idle before each request, ms, comma-separated")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--per-block", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=4, help="output tokens per request")
    ap.add_argument("--no-compile", action="store_true", help="the ring eager (a smoke run)")
    ap.add_argument("--spin-us", type=float, help="the lane's spin_us (default: its config's)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    gaps_s = [float(g) / 1e3 for g in args.gaps.split(",") if g.strip()]
    started = time.strftime("%Y-%m-%d %H:%M")
    config = {} if args.spin_us is None else {"spin_us": args.spin_us}
    with fast_ring(compile=not args.no_compile, **config) as ring:
        samples = asyncio.run(_measure(ring, gaps_s, args.rounds, args.per_block, args.tokens))
        layout, options = ring.layout, ring.options
    names = ("first_token", "send_to_step", "step", "step_compute", "step_end_to_client")
    rows = {gap: {name: 1e3 * statistics.median(col) for name, col in zip(names, zip(*xs, strict=True), strict=True)}
            for gap, xs in samples.items()}
    result = {"date": started, "command": "python -m bench.ttft_idle " + " ".join(argv), "layout": layout,
              "options": {k: str(v) for k, v in options.items()},
              "tokens": args.tokens, "rounds": args.rounds, "per_block": args.per_block,
              "p50_ms_by_gap_s": rows}
    print(f"fast lane ring {layout}, p50 of {args.rounds * args.per_block} per gap (ms)")
    print(f"{'idle before':>12} {'first token':>12} {'send->step':>11} {'step':>6} {'compute':>8} {'->client':>9}")
    for gap, r in rows.items():
        print(f"{1e3 * float(gap):10.1f}ms {r['first_token']:12.2f} {r['send_to_step']:11.2f} {r['step']:6.2f} "
              f"{r['step_compute']:8.2f} {r['step_end_to_client']:9.2f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
