"""``fastmode bench turns``: an agent-style loop of short turns, per lane, two ways.

- ``websocket``: one persistent WebSocket per conversation; each turn sends only its new input (a
  user message) with ``previous_response_id`` (the server renders the kept conversation and the new
  turn through the model's chat template, or joins them on a model without one; the lane reuses the
  history's keys and values).
- ``http_resend``: each turn a fresh HTTP connection to the OpenAI API (``/v1/chat/completions``,
  streamed), re-sending the whole history as messages: what a client without the persistent
  WebSocket does. One client per conversation opens the connections (``fresh_connections``), so
  the client's own set-up is not charged to each turn.

Several conversations run at once per lane (at most the lane's batch cap, so a capped lane never
refuses one), in steady state: each of ``--conversations`` slots runs conversations back to back,
slot ``i`` starting once slot 0 is ``i * turns / conversations`` turns in. Each slot's second
conversation is measured, and the slots go on with others (cut off at the end) until every measured
one has ended, so every measured turn, the first as much as the last, meets the same load: the
other slots' conversations at every stage. (Started together, turn 1 would be the only turn whose
prefills all arrive at once with nothing decoding, and a later turn would wait for the others'
steps: up to 1.8x turn 1 with nothing of the history prefilled again.) Before each turn the
client waits a random think time (``--think-ms``, ``THINK_MS``: an agent's tools run between its
turns), so the conversations do not fall into step (``THINK_MS`` says why). A conversation has
``--turns`` turns of one held-out source line in and ``--tokens`` greedy tokens out. Every turn's
line is whole and 8 to 16 tokens long (``LINE_TOKENS``), so turn 1 sends as much new input as turn
20 and their ratio measures the history. (With every non-empty line, cut at 60 characters, turn 1
would be a file's first line, ``#`` or ``import os``, a median 5 tokens against 10-20 later, so the
ratio would measure line lengths; and a line cut mid-word would be continued mid-word, an output
the join then separates from its prompt.) The whole loop
runs ``--repeats`` times per way, ways alternating; each repeat measures other held-out files (so no
repeat finds an earlier one's prefix cached), and the conversations around them cycle through the
files no measured conversation uses. Per lane and way: time to first token per turn (client clock,
send to first text; median over every measured conversation; on the WebSocket also the lane's own,
``engine_ttft_ms_per_turn``: from the lane taking the request to its first token), the wall time of
a measured conversation without its think time (median), the input tokens the server reused
(``cached_tokens``), and the two goals:
turn ``N``'s time to first token within 1.2x of turn 1's (the history is not re-prefilled; with a
95% bootstrap interval over the measured conversations, ``ratio_interval``: one turn's median is a
noisy figure here) and the WebSocket's wall time at least 30% under the re-send's. On loopback,
then across an emulated round trip (``bench.netem``; root only).

Usage: fastmode bench turns [--url http://HOST:PORT] [--api-key K] [--lanes fast,standard,...]
                            [--conversations 4] [--turns 20] [--tokens 8] [--repeats 3] [--think-ms 10]
                            [--rtt-ms 20] [--json F] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from bench.app import REPO
from models.eval.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED

LANE_PARAMS = {"fast": {"model": "fastmode-fast"}, "standard": {"model": "fastmode-full"},
               "priority": {"model": "fastmode-full", "service_tier": "priority"},
               "exact": {"model": "fastmode-full", "service_tier": "exact"}}
LINE_TOKENS = (8, 16)  # a turn's line: at least, at most this many tokens (the shipped models' tokenizer)
TTFT_GOAL, WALL_GOAL = 1.2, 0.7
THINK_MS = 10.0
"""The agent's mean time before a turn, ms (``think``: its tools running). Without it, conversations
that share a lane fall into step: a turn sent when the others' are ends when theirs do, so the next
ones go together again and are prefilled in one batch. A slot's new conversation starts out of step
(its connection's set-up moves it), so its turn 1 runs alone and its later turns in batches of every
slot: without think time the fast lane's own first token at a 20 ms round trip measured 2.2 ms at
turn 1 and 3.8-7.1 ms at turns 2-20, with the history's keys and values reused every turn
(docs/decisions/, "Multi-turn")."""


def ratio_interval(first: list[float], last: list[float], resamples: int = BOOTSTRAP_RESAMPLES,
                   seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile 95% interval of ``median(last) / median(first)`` over ``resamples`` bootstrap draws
    of the conversations (with replacement; a conversation keeps its pair of turns)."""
    if len(first) != len(last) or not first:
        raise ValueError(f"need two equally long, non-empty lists, got {len(first)} and {len(last)}")
    f, la = np.asarray(first, dtype=float), np.asarray(last, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(f), size=(resamples, len(f)))
    ratios = np.median(la[idx], axis=1) / np.median(f[idx], axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def conversation_inputs(conversations: int | None, turns: int) -> list[list[str]]:
    """One held-out source file per conversation, its whole lines of ``LINE_TOKENS`` tokens as turns,
    in file order (``conversations=None``: one per file with ``turns`` such lines)."""
    from tokenizers import Tokenizer

    from bench import pair
    from models.recipe import corpus

    tokenizer = Tokenizer.from_file(str(pair.full() / "tokenizer.json"))
    lo, hi = LINE_TOKENS
    _, held = corpus.split(corpus.list_files())
    out = []
    for f in held:
        lines = [line for line in f.text.splitlines() if lo <= len(tokenizer.encode(line).ids) <= hi]
        if len(lines) >= turns:
            out.append(lines[:turns])
        if len(out) == conversations:
            return out
    if conversations is None:
        return out
    raise RuntimeError(f"the held-out corpus has fewer than {conversations} files of {turns} lines of "
                       f"{lo}-{hi} tokens")


async def think(rng: random.Random, mean_s: float) -> float:
    """The agent's own time before a turn (its tools running): uniform in ``[0, 2 * mean_s]``; the
    seconds waited."""
    pause = rng.uniform(0, 2 * mean_s) if mean_s > 0 else 0.0
    if pause:
        await asyncio.sleep(pause)
    return pause


async def ws_conversation(url: str, key: str | None, lane: str, inputs: list[str], tokens: int,
                          on_turn: Callable[[int], None] | None = None, think_s: float = 0.0) -> list[dict]:
    """The turns of one conversation on one WebSocket, each continuing the last (``on_turn(k)`` after
    the ``k``-th has ended), each after ``think(think_s)`` (seeded by the conversation's first line,
    so both ways wait the same)."""
    from websockets.asyncio.client import connect

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    ws_url = "ws" + url[4:] + "/v1/responses"
    turns, previous, rng = [], None, random.Random(inputs[0])
    async with connect(ws_url, additional_headers=headers, max_size=None) as ws:
        for k, text in enumerate(inputs):
            paused = await think(rng, think_s)
            rid = f"turn-{lane}-{id(inputs)}-{k}"
            # a user message, as the re-send's: the chat template's path on a model that has one
            body = {"type": "response.create", "id": rid, **LANE_PARAMS[lane], "temperature": 0,
                    "input": [{"role": "user", "content": text}], "max_output_tokens": tokens, "ignore_eos": True}
            if previous:
                body["previous_response_id"] = previous
            sent, first = time.perf_counter(), None
            await ws.send(json.dumps(body))
            while True:
                e = json.loads(await ws.recv())
                if e["type"] == "response.output_text.delta" and first is None:
                    first = time.perf_counter()
                elif e["type"] == "error":
                    raise RuntimeError(f"turn {k} of a {lane} conversation failed: {e['code']}: {e['message']}")
                elif e["type"] == "response.completed":
                    turns.append({"ttft_s": (first or time.perf_counter()) - sent, "total_s": time.perf_counter() - sent,
                                  "input_tokens": e["usage"]["input_tokens"],
                                  "cached_tokens": e["usage"]["input_tokens_details"]["cached_tokens"],
                                  "engine_ttft_s": e["timing"]["engine_ttft_s"], "think_s": paused})
                    break
            previous = rid
            if on_turn:
                on_turn(k + 1)
    return turns


async def http_conversation(url: str, key: str | None, lane: str, inputs: list[str], tokens: int,
                            on_turn: Callable[[int], None] | None = None, think_s: float = 0.0) -> list[dict]:
    """The same conversation, each turn a fresh HTTP connection re-sending the whole history.

    One client for the conversation, which keeps no connection alive (``fresh_connections``): each
    turn connects anew, and the client's own set-up (an ``httpx`` client loads its TLS context: tens
    of milliseconds of this process's CPU, which would also stall the other conversations it drives)
    is not counted against HTTP."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    messages: list[dict[str, str]] = []
    turns, rng = [], random.Random(inputs[0])
    async with fresh_connections(url, headers) as client:
        for k, text in enumerate(inputs):
            paused = await think(rng, think_s)
            messages.append({"role": "user", "content": text})
            body = {**LANE_PARAMS[lane], "messages": messages, "temperature": 0, "max_tokens": tokens,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            sent, first, reply, usage = time.perf_counter(), None, [], None
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"turn {k} of a {lane} conversation failed: {r.status_code} {await r.aread()!r}")
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices", []):
                        piece = choice.get("delta", {}).get("content")
                        if piece:
                            first = first or time.perf_counter()
                            reply.append(piece)
            turns.append({"ttft_s": (first or time.perf_counter()) - sent, "total_s": time.perf_counter() - sent,
                          "input_tokens": usage["prompt_tokens"] if usage else None,
                          "cached_tokens": (usage or {}).get("prompt_tokens_details", {}).get("cached_tokens"),
                          "think_s": paused})
            messages.append({"role": "assistant", "content": "".join(reply)})
            if on_turn:
                on_turn(k + 1)
    return turns


def fresh_connections(url: str, headers: dict[str, str]) -> httpx.AsyncClient:
    """An HTTP client that opens a new connection for every request: none is kept alive once its
    response has been read."""
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=120,
                             limits=httpx.Limits(max_keepalive_connections=0))


async def steady(run: Callable, url: str, key: str | None, lane: str, measured: list[list[str]],
                 background: list[list[str]], turns: int, tokens: int, think_s: float = 0.0) -> list[dict]:
    """``len(measured)`` slots running conversations back to back (see the module docstring): each
    slot's second conversation is ``measured[i]``, the others come from ``background`` in turn;
    every turn after ``think(think_s)``. Returns each measured conversation's turns and wall time
    (its think time left out)."""
    n = len(measured)
    reached = [asyncio.Event() for _ in range(turns + 1)]  # slot 0's first conversation: turns ended
    reached[0].set()
    ended = asyncio.Event()  # every measured conversation
    others = itertools.cycle(background)
    results: list[dict] = []

    async def until_ended(lines: list[str]) -> None:
        task = asyncio.ensure_future(run(url, key, lane, lines, tokens, think_s=think_s))
        stop = asyncio.ensure_future(ended.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        task.cancel()  # a no-op if it ended
        with contextlib.suppress(asyncio.CancelledError):
            await task  # its own failure is raised

    async def slot(i: int) -> None:
        await reached[i * turns // n].wait()
        await run(url, key, lane, next(others), tokens, on_turn=(lambda k: reached[k].set()) if i == 0 else None,
                  think_s=think_s)
        start = time.perf_counter()
        conversation = await run(url, key, lane, measured[i], tokens, think_s=think_s)
        wall = time.perf_counter() - start - sum(t["think_s"] for t in conversation)
        results.append({"turns": conversation, "wall_s": wall})
        if len(results) == n:
            ended.set()
        while not ended.is_set():
            await until_ended(next(others))

    await asyncio.gather(*(slot(i) for i in range(n)))
    return results


async def measure(url: str, key: str | None, lanes: list[str], conversations: int, turns: int,
                  tokens: int, repeats: int = 1, think_s: float = 0.0) -> dict:
    """Every lane, both ways, one after another (never two at once), ``repeats`` times each."""
    caps = {}
    with httpx.Client(base_url=url, timeout=30) as c:
        health = c.get("/health").json()
    for lane in lanes:
        cap = health.get("lanes", {}).get(lane, {}).get("cap")
        caps[lane] = min(conversations, cap) if cap else conversations
    out = {}
    ways = {"websocket": ws_conversation, "http_resend": http_conversation}
    files = conversation_inputs(None, turns)
    for lane in lanes:
        n = caps[lane]
        inputs, background = files[:n * repeats], files[n * repeats:]
        if len(inputs) < n * repeats or not background:
            raise RuntimeError(f"the held-out corpus has {len(files)} files of {turns} lines of "
                               f"{LINE_TOKENS[0]}-{LINE_TOKENS[1]} tokens: {n * repeats} measured conversations "
                               "and at least one around them need more")
        out[lane] = {"conversations": n, "repeats": repeats}
        convs: dict[str, list] = {way: [] for way in ways}
        walls: dict[str, list[float]] = {way: [] for way in ways}
        for r in range(repeats):
            for way, run in ways.items():
                for c in await steady(run, url, key, lane, inputs[r * n:(r + 1) * n], background, turns, tokens,
                                      think_s):
                    convs[way].append(c["turns"])
                    walls[way].append(c["wall_s"])
        for way in ways:
            ttft = [statistics.median(c[k]["ttft_s"] for c in convs[way]) for k in range(turns)]
            out[lane][way] = {"wall_s": statistics.median(walls[way]), "wall_s_per_conversation": walls[way],
                              "ttft_ms_per_turn": [1e3 * t for t in ttft],
                              "input_tokens_last_turn": statistics.median(c[-1]["input_tokens"] or 0
                                                                          for c in convs[way]),
                              "cached_tokens_per_turn": [statistics.median(c[k]["cached_tokens"] or 0
                                                                           for c in convs[way]) for k in range(turns)],
                              "last_to_first_ttft": ttft[-1] / ttft[0],
                              "last_to_first_ttft_ci95": list(ratio_interval([c[0]["ttft_s"] for c in convs[way]],
                                                                             [c[-1]["ttft_s"] for c in convs[way]]))}
            if all(t.get("engine_ttft_s") is not None for c in convs[way] for t in c):
                out[lane][way]["engine_ttft_ms_per_turn"] = [
                    1e3 * statistics.median(c[k]["engine_ttft_s"] for c in convs[way]) for k in range(turns)]
        ws, http = out[lane]["websocket"], out[lane]["http_resend"]
        out[lane]["wall_ratio"] = ws["wall_s"] / http["wall_s"]
        out[lane]["goals"] = {"ttft_last_within_1_2x_of_first": ws["last_to_first_ttft"] <= TTFT_GOAL,
                              "wall_at_least_30pct_lower": out[lane]["wall_ratio"] <= WALL_GOAL}
    return out


def client_run(url: str, key: str | None, args: argparse.Namespace, prefix: list[str] = ()) -> dict:
    """This module's ``--client-only`` in a fresh process (behind ``prefix``: in the client's namespace)."""
    cmd = [*prefix, sys.executable, "-m", "bench.turns", "--client-only", "--url", url, "--lanes", ",".join(args.lanes),
           "--conversations", str(args.conversations), "--turns", str(args.turns), "--tokens", str(args.tokens),
           "--repeats", str(args.repeats), "--think-ms", str(args.think_ms)]
    env = dict(os.environ, FASTMODE_API_KEY=key or "")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"the turns client failed ({r.returncode}): {r.stderr[-3000:]}")
    return json.loads(r.stdout)


def print_table(label: str, result: dict) -> None:
    print(f"\n{label}")
    print(f"{'lane':<9} {'way':<12} {'ttft t1':>8} {'ttft tN':>8} {'tN/t1':>6} {'95% interval':>13} "
          f"{'cached tN':>9} {'wall s':>7}")
    for lane, r in result.items():
        for way in ("websocket", "http_resend"):
            w = r[way]
            t = w["ttft_ms_per_turn"]
            lo, hi = w["last_to_first_ttft_ci95"]
            print(f"{lane:<9} {way:<12} {t[0]:7.1f}ms {t[-1]:7.1f}ms {w['last_to_first_ttft']:6.2f} "
                  f"{f'[{lo:.2f}, {hi:.2f}]':>13} {w['cached_tokens_per_turn'][-1]:5.0f}/{w['input_tokens_last_turn']:<4.0f}"
                  f"{w['wall_s']:7.2f}")
        if own := r["websocket"].get("engine_ttft_ms_per_turn"):
            print(f"{'':<9} websocket, the lane's own first token: turn 1 {own[0]:.1f} ms, turn {len(own)} "
                  f"{own[-1]:.1f} ms")
        print(f"{'':<9} websocket wall time {r['wall_ratio']:.2f}x the re-send's; goals: {r['goals']}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="fastmode bench turns", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=os.environ.get("FASTMODE_API_KEY"))
    ap.add_argument("--lanes", type=lambda s: [x for x in s.split(",") if x], default=list(LANE_PARAMS))
    ap.add_argument("--conversations", type=int, default=4, help="conversations at once per lane (at most its cap): "
                    "slots, each running conversations back to back")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=8, help="output tokens per turn")
    ap.add_argument("--repeats", type=int, default=3, help="runs of the whole loop per way (other files each)")
    ap.add_argument("--think-ms", type=float, default=THINK_MS, help="the agent's mean time before each turn "
                    "(uniform in [0, 2x]; 0: none)")
    ap.add_argument("--rtt-ms", default="20", help="emulated round trips, comma-separated (empty: skip)")
    ap.add_argument("--quick", action="store_true", help="2 conversations of 4 turns, fast and standard, loopback, "
                    "once")
    ap.add_argument("--client-only", action="store_true", help="print the measurement as JSON (the client side "
                    "of the emulated network)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.url.startswith("ws"):
        args.url = "http" + args.url[2:]
    bad = [lane for lane in args.lanes if lane not in LANE_PARAMS]
    if bad:
        ap.error(f"unknown lanes {bad}; lanes: {', '.join(LANE_PARAMS)}")
    if args.client_only:
        print(json.dumps(asyncio.run(measure(args.url, args.api_key or None, args.lanes, args.conversations,
                                             args.turns, args.tokens, args.repeats, args.think_ms / 1e3))))
        return 0
    if args.quick:
        args.conversations, args.turns, args.lanes, args.rtt_ms, args.repeats = 2, 4, ["fast", "standard"], "", 1
    started = time.strftime("%Y-%m-%d %H:%M")
    loopback = client_run(args.url, args.api_key, args)
    print_table("loopback", loopback)
    networks, skipped = [], None
    for rtt in [float(x) for x in args.rtt_ms.split(",") if x.strip()]:
        from urllib.parse import urlparse

        from bench.netem import emulated_network

        try:
            with emulated_network(urlparse(args.url).port or 80, rtt) as net:
                res = client_run(f"http://{net.host}:{net.port}", args.api_key, args, net.client_prefix)
                networks.append({"rtt_ms": rtt, "method": net.method, "lanes": res})
                print_table(f"{rtt:g} ms round trip ({net.method})", res)
        except PermissionError as e:
            skipped = str(e)
            print(f"emulated network: {skipped}", file=sys.stderr)
            break
    result = {"date": started, "command": "fastmode bench turns " + shlex.join(argv),
              "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
              "settings": {"conversations": args.conversations, "turns": args.turns, "tokens": args.tokens,
                           "repeats": args.repeats, "think_ms": args.think_ms,
                           "lanes": args.lanes, "line_tokens": list(LINE_TOKENS)},
              "goals": {"ttft_last_over_first_at_most": TTFT_GOAL, "wall_ratio_at_most": WALL_GOAL},
              "loopback": loopback, "emulated_network": networks, "emulated_network_skipped": skipped}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
