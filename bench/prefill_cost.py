"""What a prompt token costs a full-model lane's first token, on an idle engine in process.

A turn continued with ``previous_response_id`` prefills what the lane's prefix cache does not hold:
(vLLM's lanes) the history's tail that fills no KV block, the previous turn's output where the join
does not follow the text it was generated after (it does when that output starts with a line
break: ``serve.request.join_messages``) and the new input. Whether that can keep turn 20's first
token within 1.2x of turn 1's depends on what each prefilled token costs against the fixed cost of
a step. This starts the lane's own engine (``VLLMLaneEngine`` for priority and standard,
``SpeculativeLaneEngine`` for exact; the lane's default config) and times first tokens of fresh
prompts of several lengths, interleaved, skipping the first rounds; prints the median per length
and the least-squares slope (ms per prompt token).

``--replay N`` then replays ``fastmode bench turns``' conversations (the same held-out lines, 20
turns, 8 greedy tokens, the history joined as the router joins it) one at a
time on the same engine: each turn's first token and the prompt tokens it prefilled (those the
prefix cache did not hold). Without the serving path and with one conversation at a time, it shows
what the history itself costs a later turn.

``--history 0,100,200,400`` then times a fixed 12 new tokens after a history of each length that
the prefix cache holds (random ids, interleaved, first rounds skipped): nothing of the history is
prefilled, but every new token attends over all of it, which is what a later turn cannot avoid.

Usage: python -m bench.prefill_cost [--lane standard|priority|exact] [--lengths 4,16,32,48,64] [--rounds 12]
                                    [--replay 0] [--history ''] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

from models import TEST_FAST, TEST_FULL
from serve.config import LANE_CONFIGS
from serve.request import join_messages

WARM_ROUNDS = 2
NEW_TOKENS = 12  # --history: a later turn's new tokens (bench.turns' lines are 8-16)


async def _first_token(engine, request_id: str, ids: list[int], tokens: int) -> tuple[float, int, str]:
    """(ms to the first output, prompt tokens the prefix cache held, the output text)."""
    from serve.lanes.engine import EngineRequest

    t0, first, cached, text = time.perf_counter(), None, None, []
    async for out in engine.generate(EngineRequest(request_id, ids, tokens, temperature=0.0, ignore_eos=True)):
        if first is None:
            first, cached = time.perf_counter(), out.cached_tokens or 0
        text.append(out.text)
    return 1e3 * (first - t0), cached, "".join(text)


def _engine(lane: str):
    """The lane's own engine with its default config: vLLM's for priority and standard, fastmode's
    speculative engine (compiled, warmed up, packed weights where they run) for exact."""
    if lane == "exact":
        from tokenizers import Tokenizer

        from serve.lanes.speculative_engine import SpeculativeLaneEngine

        return SpeculativeLaneEngine(TEST_FULL, TEST_FAST, LANE_CONFIGS[lane].model_validate({}),
                                     Tokenizer.from_file(str(Path(TEST_FULL) / "tokenizer.json")))
    from serve.lanes.vllm_engine import VLLMLaneEngine

    return VLLMLaneEngine(TEST_FULL, LANE_CONFIGS[lane].model_validate({}))


async def _run(lane: str, lengths: list[int], rounds: int, replay: int, history: list[int]) -> dict:
    engine = _engine(lane)
    rng = random.Random(0)
    ttft: dict[int, list[float]] = {n: [] for n in lengths}
    try:
        for r in range(rounds + WARM_ROUNDS):
            for n in lengths:
                ids = [rng.randrange(300, 3000) for _ in range(n)]  # fresh ids: nothing in the prefix cache
                ms, _, _ = await _first_token(engine, f"p{r}-{n}", ids, 2)
                if r >= WARM_ROUNDS:
                    ttft[n].append(ms)
        turns = await _replay(engine, replay) if replay else None
        after = await _after_history(engine, history, rounds, rng) if history else None
    finally:
        engine.shutdown()
    med = {n: statistics.median(v) for n, v in ttft.items()}
    slope = statistics.linear_regression(list(med), list(med.values())).slope if len(med) > 1 else None
    return {"lane": lane, "rounds": rounds, "ttft_ms_median": med, "ms_per_prompt_token": slope, "replay": turns,
            "after_history": after}


async def _after_history(engine, lengths: list[int], rounds: int, rng: random.Random, new: int = NEW_TOKENS) -> dict:
    """Median first token of ``new`` fresh tokens after a cached history of each length, and the
    prompt tokens prefilled (``new`` plus the history's last token: a sequence's cache holds all
    but its last token)."""
    ms: dict[int, list[float]] = {n: [] for n in lengths}
    prefilled: dict[int, list[int]] = {n: [] for n in lengths}
    for r in range(rounds + WARM_ROUNDS):
        for n in lengths:
            history = [rng.randrange(300, 3000) for _ in range(n + 1)]
            if n:
                await _first_token(engine, f"h{r}-{n}", history, 1)  # now the prefix cache holds it
            ids = history + [rng.randrange(300, 3000) for _ in range(new)]
            t, cached, _ = await _first_token(engine, f"t{r}-{n}", ids, 2)
            if r >= WARM_ROUNDS:
                ms[n].append(t)
                prefilled[n].append(len(ids) - cached)
    return {"new_tokens": new, "ttft_ms_median": {n: statistics.median(v) for n, v in ms.items()},
            "prefilled_median": {n: statistics.median(v) for n, v in prefilled.items()}}


async def _replay(engine, conversations: int, turns: int = 20, tokens: int = 8) -> dict:
    from tokenizers import Tokenizer

    from bench.turns import conversation_inputs

    tokenizer = Tokenizer.from_file(str(Path(TEST_FULL) / "tokenizer.json"))
    ms: list[list[float]] = [[] for _ in range(turns)]
    prefilled: list[list[int]] = [[] for _ in range(turns)]
    for c, lines in enumerate(conversation_inputs(conversations, turns)):
        messages: list[tuple[str, str]] = []
        for k, line in enumerate(lines):
            messages.append(("user", line))
            ids = tokenizer.encode(join_messages(messages)).ids  # as the router joins a conversation
            t, cached, text = await _first_token(engine, f"c{c}-{k}", ids, tokens)
            messages.append(("assistant", text))
            ms[k].append(t)
            prefilled[k].append(len(ids) - cached)
    per_turn = [statistics.median(v) for v in ms]
    return {"conversations": conversations, "ttft_ms_per_turn": per_turn,
            "prefilled_tokens_per_turn": [statistics.median(v) for v in prefilled],
            "last_to_first_ttft": per_turn[-1] / per_turn[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lane", default="standard", choices=["priority", "standard", "exact"])
    ap.add_argument("--lengths", default="4,16,32,48,64")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--replay", type=int, default=0, help="then replay this many bench.turns conversations")
    ap.add_argument("--history", default="", help=f"then time {NEW_TOKENS} new tokens after a cached history of "
                    "each of these lengths (comma-separated)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    history = [int(x) for x in args.history.split(",") if x.strip()]
    result = asyncio.run(_run(args.lane, [int(x) for x in args.lengths.split(",")], args.rounds, args.replay,
                              history))
    for n, t in result["ttft_ms_median"].items():
        print(f"{n:4d} prompt tokens: first token {t:.2f} ms")
    if result["ms_per_prompt_token"] is not None:  # (one length: no slope)
        print(f"slope: {result['ms_per_prompt_token']:.3f} ms per prompt token")
    if (r := result["replay"]) is not None:
        for k, (t, n) in enumerate(zip(r["ttft_ms_per_turn"], r["prefilled_tokens_per_turn"])):
            print(f"turn {k + 1:2d}: first token {t:.2f} ms, {n:.0f} tokens prefilled")
        print(f"turn {len(r['ttft_ms_per_turn'])} / turn 1: {r['last_to_first_ttft']:.2f}x")
    if (h := result["after_history"]) is not None:
        for n, t in h["ttft_ms_median"].items():
            print(f"{h['new_tokens']} new tokens after {n:4d} cached: first token {t:.2f} ms "
                  f"({h['prefilled_median'][n]:.0f} prefilled)")
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                                         "command": " ".join(["python -m bench.prefill_cost", *(argv or sys.argv[1:])]),
                                         **result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
