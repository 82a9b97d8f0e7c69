"""``fastmode bench BENCHMARK [ARGS...]``: one subcommand per benchmark of ``make bench``, each in
its own module with its own options (``fastmode bench BENCHMARK --help``); ``fastmode bench all``
runs them all and writes ``docs/benchmarks.md`` (``bench.suite``). ``fastmode bench speculative``,
outside ``all``, measures what the exact lane's engine choice rests on.

Modules are imported only when their benchmark runs, so ``fastmode bench --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHMARKS: dict[str, tuple[str, str]] = {
    "all": ("bench.suite", "every benchmark in one run, then docs/benchmarks.md (what make bench runs)"),
    "sharding": ("bench.sharding", "the fast lane's executor: tp x pp layouts, hop costs, the planner"),
    "decode": ("bench.decode", "batch-1 decode in process on the full model: the executor against llama-bench "
               "and vLLM's engine, same weights and threads, with a profile"),
    "vllm": ("bench.vllm_serve", "vLLM's own OpenAI server and Ray Serve LLM on the same checkpoints, same load"),
    "llama-cpp": ("bench.llama_cpp_serve", "llama.cpp's llama-server on the same checkpoints as GGUF, same load "
                  "(builds llama.cpp once unless --quick or --no-build)"),
    "lanes": ("bench.lanes", "lanes under load: concurrency sweep on standard, priority, fast and exact"),
    "paired": ("bench.paired", "the standard lane and vLLM's own server, measured in alternation "
               "(starts vLLM's server beside the application)"),
    "quality": ("bench.quality", "quality against speed per lane and auto, with the Pareto frontier"),
    "gateway": ("bench.gateway", "front-door cost and time to first token, loopback and emulated network"),
    "turns": ("bench.turns", "multi-turn: previous_response_id on one WebSocket against re-sending over HTTP"),
    "soak": ("bench.soak", "sustained mixed load and vanishing clients: every delta accounted for, nothing leaked"),
    "fuzz": ("bench.fuzz", "hostile input at every front door, run long (starts its own application)"),
    "speculative": ("bench.speculative", "where the exact lane runs: speculative decoding in vLLM and in fastmode's "
                    "executor, one stream (no app; not in all: rerun it on new hardware)"),
}
"""Subcommand -> (module whose ``main(argv)`` runs it, one-line help)."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    if argv[:1] and argv[0] in BENCHMARKS:
        return int(importlib.import_module(BENCHMARKS[argv[0]][0]).main(argv[1:]) or 0)
    ap = argparse.ArgumentParser(prog="fastmode bench", description="fastmode's benchmarks (most against a running "
                                 "application, fastmode up); fastmode bench BENCHMARK --help for its options.")
    sub = ap.add_subparsers(dest="bench", metavar="BENCHMARK")
    for name, (_, help_) in BENCHMARKS.items():
        sub.add_parser(name, help=help_)
    ap.parse_args(argv)  # --help prints the list and exits; an unknown name is an error
    ap.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
