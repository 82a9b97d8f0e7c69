"""``bench.report``: the published report from the kept results, with no machine path in it."""

from __future__ import annotations

import re

from bench.app import REPO
from bench.report import relative, shown, write_report

MACHINE_PATH = re.compile(r"(?<![\w:/.~-])/(work|root|home|tmp|usr|opt|var|mnt)/")


def test_machine_paths_become_relative(tmp_path):
    out = tmp_path / "run"
    assert shown(REPO / "bench/results") == "bench/results" and shown(out) == "OUT"
    # under the results directory; under this checkout; under another checkout (the machine that ran it)
    assert relative(f"fastmode bench soak --json {out}/soak.json", out) == "fastmode bench soak --json OUT/soak.json"
    assert relative(f"--model {REPO}/models/full", out) == "--model models/full"
    assert relative("--out /elsewhere/x/bench/results", out) == "--out /elsewhere/x/bench/results"  # not a machine root
    assert relative("/srv/ci/fastmode/bench/results/turns.json", out) == "bench/results/turns.json"
    assert (relative("""--speculative-config '{"model": "/work/main/models/fast"}'""", out)
            == """--speculative-config '{"model": "models/fast"}'""")
    assert relative("/work/main/.venv/bin/python -m x", out) in ("python -m x", ".venv/bin/python -m x")
    assert relative("--out /tmp/q", out) == "--out q"  # any other machine path: its name
    # URLs and API routes are not machine paths
    for text in ("ws://127.0.0.1:25441/v1/responses", "GET /v1/door", "tok/s", "../bench/results/a.png"):
        assert relative(text, out) == text


def test_the_published_report_names_no_machine_path_issue_or_seeds(tmp_path):
    text = write_report(REPO / "bench/results", tmp_path / "benchmarks.md")
    assert "## 1. Lanes under load" in text and "## 8. Hostile input at every front door" in text
    assert "Not run" not in text  # every stage's results are kept
    assert not MACHINE_PATH.search(text), MACHINE_PATH.search(text)
    assert str(REPO) not in text and not re.search(r"\bissue \d+", text) and "seeds" not in text
    assert "Anthropic's fast mode" in text and "OpenAI's Codex-Spark" in text
