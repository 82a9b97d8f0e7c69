"""``bench.probes``: each probe in a tiny setting, on this machine (no application)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from bench.probes import compile_regions, huge_pages, startup_cpu, threads
from models import TEST_FAST, TEST_FULL
from sharding import packed
from tests.conftest import shipped

BUSY_THEN_READY = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
                   "print('ready in 0 s', flush=True)\ntime.sleep(120)")


def test_threads_reads_every_thread_by_role(tmp_path):
    out = tmp_path / "threads.json"
    assert threads.main(["--seconds", "0.3", "--top", "3", "--json", out]) == 0
    doc = json.loads(out.read_text())
    assert 0.3 <= doc["seconds"] < 30 and doc["cores"] == os.cpu_count()
    mine = [r for r in doc["threads"] if r["pid"] == os.getpid()]
    assert all(r["role"] == "this probe" for r in mine)
    for r in doc["threads"]:
        assert r["cpu_pct"] >= 0 and r["wait_pct"] >= 0 and r["wakeups_per_s"] >= 0 and r["preemptions_per_s"] >= 0
    # the roles' figures are their threads' sums
    total = sum(r["wakeups_per_s"] for r in doc["threads"])
    assert abs(total - sum(r["wakeups_per_s"] for r in doc["roles"].values())) < 1e-6 * max(1, total)


def test_startup_cpu_reads_until_ready_then_stops_the_command(tmp_path, capsys):
    out, log = tmp_path / "startup.json", tmp_path / "up.log"
    assert startup_cpu.main(["--window", "0.1", "--timeout", "60", "--log", log, "--json", out,
                             "--", sys.executable, "-c", BUSY_THEN_READY]) == 0
    doc = json.loads(out.read_text())
    assert doc["state"] == "ready" and doc["windows"] and doc["seconds"] < 60
    assert doc["cpu_s_until_end"][startup_cpu.MINE] >= 0.3  # the command's busy loop, counted as its own
    assert "ready in 0 s" in log.read_text() and "ready after" in capsys.readouterr().out


def test_startup_cpu_reports_a_command_that_exits_before_ready(tmp_path):
    out = tmp_path / "startup.json"
    assert startup_cpu.main(["--window", "0.1", "--json", out, "--", sys.executable, "-c", "raise SystemExit(3)"]) == 1
    assert json.loads(out.read_text())["state"] == "exited (3)"


@pytest.mark.skipif(packed.unavailable_reason() is not None, reason=str(packed.unavailable_reason()))
def test_huge_pages_times_the_arena_against_ordinary_pages(tmp_path):
    out = tmp_path / "huge.json"
    assert huge_pages.main(["--model", shipped(TEST_FULL), "--repeats", "2", "--threads", "1", "--json", out]) == 0
    doc = json.loads(out.read_text())
    layers = json.loads((shipped(TEST_FULL) / "config.json").read_text())["num_hidden_layers"]
    assert doc["linears"] == 4 * layers + 1  # qkv, o, gate_up and down per layer, the head
    assert doc["arena_ms"] > 0 and doc["plain_ms"] > 0
    assert doc["arena_over_plain"] == pytest.approx(doc["arena_ms"] / doc["plain_ms"])
    assert doc["arena_gb_per_s"] == pytest.approx(doc["weight_bytes"] / doc["arena_ms"] / 1e6)


@pytest.mark.full  # inductor compiles the test model both ways and warms an exact engine up (minutes)
def test_compile_regions_times_both_compiles_and_the_exact_warm_up(tmp_path):
    out = tmp_path / "regions.json"
    assert compile_regions.main(["--full", shipped(TEST_FULL), "--fast", shipped(TEST_FAST), "--repeats", "1",
                                 "--warm-up", "regions", "--json", out]) == 0
    doc = json.loads(out.read_text())
    step = doc["step"]
    assert step["whole"]["step_ms"] > 0 and step["regions"]["step_ms"] > 0
    assert step["regions_over_whole"] == pytest.approx(step["regions"]["step_ms"] / step["whole"]["step_ms"])
    layers = json.loads((shipped(TEST_FULL) / "config.json").read_text())["num_hidden_layers"]
    assert doc["warm_up_regions"]["graphs"] > 0 and doc["warm_up_regions"]["target_layers"] == layers
