"""The lanes' engines in this process, without serving: what ``fastmode bench gateway`` holds the
served lanes against, and the ring that ``bench.ttft_idle`` and ``bench.ttft_layers`` time.

``direct`` measures vLLM ``AsyncLLM`` on the full model (the standard lane's config) and the fast
model's ring (the fast lane's layout and options), optionally alternating each measurement with
the same one on the served lane; ``fast_ring`` builds that ring here on a local Ray of its own.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Sequence
from unittest.mock import patch

from bench.rounds import round_order
from sharding import cpus

TTFT_TRIALS = 80
"""First tokens the fast ring's own time to first token is the median of (the physical limit
``fastmode bench gateway`` holds the served first token against)."""
TTFT_ROUNDS = 8
"""With served sides to compare (``direct(served_ttft=...)``), the trials run in this many blocks
of each, alternating (A B C, C B A, ...): one block the machine runs slow in (a fifth of them on a
2-core VM, about 0.3-0.5 ms a first token slower) moves the median of 8 blocks less than that of 4."""
TTFT_PROMPT = "class Parser:\n"
"""The prompt of every first-token measurement, in process and served (``bench.gateway.PROMPT``)."""


def direct(tokens: int, runs: int, concurrency: int = 0,
           served_aggregate: Callable[[], Awaitable[float]] | None = None, rounds: int = 1,
           compile: bool = True, served_ttft: dict[str, Callable[[int], list[float]]] | None = None,
           idle_s: Sequence[float] = (), served_decode: Callable[[], Awaitable[float]] | None = None) -> dict:
    """The lanes' engines without serving: vLLM AsyncLLM on the full model (the standard lane's
    config) and the fast model's ring with the fast lane's layout and options (``ring_options``:
    slots, spin, prefix cache, packed weights), driven by its own blocking client.

    Single-stream decode tokens/s of each (``vllm_full``, ``sharded_fast``), the ring's time to
    first token for ``TTFT_PROMPT`` (``sharded_fast_ttft_s``: prefill and one token, median of
    ``TTFT_TRIALS``, after the prompt's first two runs, so its prefix is cached as it is on the lane
    after one request), and with ``concurrency`` the aggregate tokens/s of vLLM serving that many
    ``tokens``-token requests at once (``vllm_full_aggregate``, the median of ``rounds``).

    ``compile``: the fast model as the lane runs it (``lanes.fast.compile``); ``False`` keeps it eager
    (``--quick``: no compile of its own, whose figures no one reads). ``sharded_fast_compiled`` says
    which ran.

    ``served_aggregate``, awaited once per round, measures the same load on the served lane: the
    rounds alternate it with the engine in process (A B, B A, ...), so that slow drift of the
    machine's speed hits both alike; its figures come back as ``served_aggregates``, in order with
    ``vllm_full_aggregates``. Each of ``served_ttft`` (name -> ``f(n)``) likewise returns ``n`` served
    first tokens (seconds): ``TTFT_ROUNDS`` blocks of each alternate with blocks of the ring's own, the
    ring's second in each round (``served_ttft_samples_s``, by name; ``sharded_fast_ttft_samples_s``).

    ``served_decode``, awaited once per run, measures one stream's decode tokens/s on the served
    standard lane: then the ``runs`` single-stream runs of vLLM in process alternate with it (A B,
    B A, ...; ``served_decodes``, in order with ``vllm_full_decodes``).

    ``idle_s``: for each, the ring's time to first token when it has been idle that long before each
    request (``sharded_fast_ttft_after_idle_s``, keyed by the seconds as a string; median of
    ``TTFT_TRIALS // 2``). A client that sends its next request once it has seen the last one end
    leaves the ring idle for at least one network round trip; on this VM a first token after a few
    milliseconds idle costs about twice one sent back to back (docs/decisions/)."""
    import asyncio

    from bench import pair
    from serve.config import AppConfig, StandardLaneConfig

    FULL = pair.full()

    out = {}

    async def vllm_runs() -> list[float]:
        from tokenizers import Tokenizer

        from serve.lanes.engine import EngineRequest
        from serve.lanes.vllm_engine import VLLMLaneEngine

        # the served side's prompt (bench.gateway sends TTFT_PROMPT), as the gateway tokenizes it
        prompt = Tokenizer.from_file(str(FULL / "tokenizer.json")).encode(TTFT_PROMPT).ids
        engine = VLLMLaneEngine(FULL, StandardLaneConfig())
        rates, served_rates = [], []

        async def single(i: int, n_tokens: int) -> float:
            n, first = 0, None
            async for o in engine.generate(EngineRequest(f"d{i}", prompt, n_tokens, temperature=0, ignore_eos=True)):
                n += len(o.token_ids)
                first = first or time.perf_counter()
            return (n - 1) / (time.perf_counter() - first)

        try:
            await single(0, 8)
            for r in range(runs):
                sides = [(served_rates, served_decode), (rates, lambda r=r: single(r + 1, tokens))]
                for figures, measure in round_order(sides, r):
                    if measure is not None:
                        figures.append(await measure())
            out["vllm_full_decodes"] = rates
            if served_decode is not None:
                out["served_decodes"] = served_rates
            if concurrency:
                async def one(rid: str) -> int:
                    n = 0
                    async for o in engine.generate(EngineRequest(rid, prompt, tokens,
                                                                 temperature=0, ignore_eos=True)):
                        n += len(o.token_ids)
                    return n

                async def in_process(r: int) -> float:
                    start = time.perf_counter()
                    total = sum(await asyncio.gather(*(one(f"c{r}-{i}") for i in range(concurrency))))
                    return total / (time.perf_counter() - start)

                ours, served = [], []
                for r in range(rounds):
                    sides = [(served, served_aggregate), (ours, lambda r=r: in_process(r))]
                    for figures, measure in round_order(sides, r):
                        if measure is not None:
                            figures.append(await measure())
                out["vllm_full_aggregate"] = statistics.median(ours)
                out["vllm_full_aggregates"] = ours
                out["vllm_full_aggregate_concurrency"] = concurrency
                if served_aggregate is not None:
                    out["served_aggregates"] = served
        finally:
            engine.shutdown()
        return rates

    # Placed as the application places its engines by default (sharding/cpus.py; FASTMODE_CPUS=auto:
    # this process and vLLM's scheduler on the serving CPUs, vLLM's worker and the chips on the others).
    with patch.dict(os.environ, {cpus.ENV: os.environ.get(cpus.ENV, AppConfig().cpus)}), cpus.placed("serving"):
        out |= _engines(tokens, runs, vllm_runs, compile, served_ttft, idle_s)
    print(f"direct    vLLM AsyncLLM, full model {out['vllm_full']:6.0f} tok/s   fastmode executor, fast model "
          f"{out['layout']} {out['sharded_fast']:6.0f} tok/s", flush=True)
    return out


@dataclass
class FastRing:
    """The fast lane's ring in this process (``fast_ring``)."""

    model: Any
    """The ``sharding.pipeline.ShardedModel``, warmed up, its ``tokenizer`` set."""
    prompt: list[int]
    """``TTFT_PROMPT``'s token ids."""
    layout: str
    """``tp=.. x pp=.. (transport)``."""
    options: dict
    """``ShardedModel.from_pretrained``'s options (the lane's ``ring_options``)."""


@contextlib.contextmanager
def fast_ring(compile: bool = True, model: Path | None = None, **config: Any) -> Iterator[FastRing]:
    """The fast lane's ring built in this process as ``fastmode up`` deploys it on this machine: its
    layout (``resolve_layout``) and options (``ring_options``), on a local Ray of its own (shut down
    on exit). ``compile=False``: eager, whatever the lane's config says (smoke runs); ``model``: a
    fast model's checkpoint other than the pair's (``bench.pair.fast``); ``config``: fields of the
    lane's config (``FastLaneConfig``) other than their defaults."""
    import ray
    from tokenizers import Tokenizer

    from bench import pair
    from serve.config import FastLaneConfig
    from serve.lanes.sharded_engine import resolve_layout, ring_options
    from sharding.pipeline import ShardedModel

    FAST = model or pair.fast()
    cfg = FastLaneConfig(**config)
    tp, pp, _ = resolve_layout(FAST, cfg, os.cpu_count() or 1)
    options = ring_options(cfg, FAST, tp) | {"compile": cfg.compile and compile}
    tokenizer = Tokenizer.from_file(str(FAST / "tokenizer.json"))
    ray.init(address="local", resources={"chip": tp * pp}, include_dashboard=False, log_to_driver=False)
    try:
        with ShardedModel.from_pretrained(FAST, tp=tp, pp=pp, **options) as m:
            m.warmup()
            m.tokenizer = tokenizer
            yield FastRing(m, tokenizer.encode(TTFT_PROMPT).ids, f"tp={tp} x pp={pp} ({cfg.transport})", options)
    finally:
        ray.shutdown()


def _engines(tokens: int, runs: int, vllm_runs, compile: bool = True,
             served_ttft: dict[str, Callable[[int], list[float]]] | None = None,
             idle_s: Sequence[float] = ()) -> dict:
    import asyncio

    from sharding.sampling import SamplingParams

    out = {"vllm_full": statistics.median(asyncio.run(vllm_runs()))}
    with fast_ring(compile) as ring:
        m, prompt = ring.model, ring.prompt
        m.generate([prompt], SamplingParams(temperature=0, max_tokens=8))
        rates = []
        for _ in range(runs):
            t = time.perf_counter()
            m.generate([prompt], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
            rates.append(tokens / (time.perf_counter() - t))
        out["sharded_fast"] = statistics.median(rates)

        def engine_ttft(n: int, idle: float = 0.0) -> list[float]:
            xs = []
            for _ in range(n):
                if idle:
                    time.sleep(idle)
                t = time.perf_counter()
                m.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
                xs.append(time.perf_counter() - t)
            return xs

        engine_ttft(2)  # the prompt's first run (its prefix is cached from then on, as on the lane)
        if not served_ttft:
            out["sharded_fast_ttft_s"] = statistics.median(engine_ttft(TTFT_TRIALS))
        else:  # alternate blocks of each, so that the machine's drift hits all alike
            ours, served = [], {name: [] for name in served_ttft}
            sides = [(served[name], f) for name, f in served_ttft.items()]
            sides.insert(1, (ours, engine_ttft))
            for r in range(TTFT_ROUNDS):
                for figures, measure in round_order(sides, r):
                    figures.extend(measure(TTFT_TRIALS // TTFT_ROUNDS))
            out["sharded_fast_ttft_s"] = statistics.median(ours)
            out["sharded_fast_ttft_samples_s"], out["served_ttft_samples_s"] = ours, served
        if idle_s:
            out["sharded_fast_ttft_after_idle_s"] = {
                str(idle): statistics.median(engine_ttft(TTFT_TRIALS // 2, idle)) for idle in idle_s}
    out["layout"] = ring.layout
    out["sharded_fast_compiled"] = ring.options["compile"]
    out["sharded_fast_options"] = {k: str(v) for k, v in ring.options.items()}
    return out
