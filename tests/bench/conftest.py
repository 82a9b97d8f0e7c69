"""Fixtures of the benchmarks' tests: one ``fastmode bench all --quick`` against the shared application
for every smoke test of a stage, and a runner for a benchmark module in its own process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def quick_run(app, tmp_path_factory) -> tuple[Path, float]:
    """(results directory, seconds) of ``fastmode bench all --quick --url <the shared app>``."""
    from bench.suite import main

    a = app()
    out = tmp_path_factory.mktemp("bench_quick")
    t = time.perf_counter()
    # fuzz starts an application of its own (tests/serve/test_fuzz.py runs beside this one anyway)
    rc = main(["--quick", "--url", a.base, "--api-key", a.key, "--out", str(out), "--skip", "fuzz"])
    seconds = time.perf_counter() - t
    assert rc == 0, (out / "suite.json").read_text()
    return out, seconds


@pytest.fixture(scope="session")
def run_module():
    """``run_module("bench.x", *args)``: ``python -m bench.x ARGS`` in its own process, as a user runs it
    (its engines and Ray out of the test process); its stdout, after asserting exit code 0."""
    import os
    import subprocess
    import sys

    from bench.app import REPO

    def run(module: str, *args: object, timeout: float = 900) -> str:
        proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=REPO, capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc.stdout

    return run
