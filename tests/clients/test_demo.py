"""The embedded default (`make up` until the serving lanes land): both models complete a prompt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from models import TEST_FAST, TEST_FULL
from tests.conftest import shipped

REPO = Path(__file__).resolve().parents[2]


def test_demo_runs_both_models_and_reports_hops():
    shipped(TEST_FULL), shipped(TEST_FAST)
    proc = subprocess.run([sys.executable, "-m", "clients.cli", "demo", "--max-tokens", "8"],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "--- full" in out and "--- fast" in out and "pipeline of 2 chips" in out
    assert "hop " in out and "chip0 -> " in out
    assert out.count("tokens in") == 2
