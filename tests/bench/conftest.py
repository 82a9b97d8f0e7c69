"""One ``fastmode bench all --quick`` against the shared application, for every smoke test here."""

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
