"""The model pair a benchmark measures: the embedded default's (what ``make bench`` serves), or the
test pair's where ``FASTMODE_BENCH_PAIR=test`` (the test suite's smoke runs, beside apps serving it).

Benchmarks that load checkpoints themselves (vLLM's server, llama.cpp, the ring in process, the
tokenizer that builds a workload) take them from here, so that they measure what the app serves.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "FASTMODE_BENCH_PAIR"


def models() -> tuple[Path, Path]:
    """(full, fast) checkpoint folders."""
    which = os.environ.get(ENV, "default")
    if which == "test":
        from models import TEST_FAST, TEST_FULL

        return TEST_FULL, TEST_FAST
    if which != "default":
        raise ValueError(f"{ENV}={which!r}: use default or test")
    from models.builtin import default_pair

    return default_pair()


def full() -> Path:
    return models()[0]


def fast() -> Path:
    return models()[1]
