"""``fastmode demo``: both models of the embedded default complete a prompt on fastmode's executor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]


def test_demo_runs_both_models_and_reports_hops():
    proc = subprocess.run([sys.executable, "-m", "clients.cli", "demo", "--max-tokens", "8"],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "--- full" in out and "--- fast" in out and "pipeline of 2 chips" in out
    assert "hop " in out and "chip0 -> " in out
    assert out.count("tokens in") == 2
