"""``bench.cpu_profile``: process roles from Ray's and vLLM's process titles, CPU attribution."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.cpu_profile import main, per_role, role, snapshot


def test_roles_from_process_titles():
    assert role("ray::ServeReplica:fastmode:standard-lane") == "standard-lane"
    assert role("ray::ServeReplica:fastmode:gateway") == "gateway"
    assert role("ray::ServeController.listen_for_change") == "serve controller"
    assert role("ray::ProxyActor") == "serve proxy"
    assert role("ray::ChipWorker.loop") == "fast-lane chips"
    assert role("/x/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp") == "ray daemons"
    assert role("VLLM::EngineCore") is None  # attributed to the lane replica that started it


def test_a_child_process_counts_for_its_ancestor_and_cpu_adds_up():
    before = snapshot()
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\ninput()"],
                             stdin=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            after = snapshot()
            if child.pid in after and after[child.pid][1] >= 0.25:
                break
            assert time.monotonic() < deadline, "the child never used 0.25 s of CPU"
        assert after[child.pid][0] == "load generator" and after[os.getpid()][0] == "load generator"
        cpu = per_role(before, after)
        assert cpu["load generator"] >= 0.25
    finally:
        child.communicate("")


def test_idle_mode_reads_the_window_without_a_server(tmp_path, capsys):
    """``--idle-s`` sends nothing (no server at the URL): it reports each role's CPU over the window."""
    import json

    out = tmp_path / "idle.json"
    assert main(["--url", "ws://127.0.0.1:9", "--idle-s", "0.3", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["output_tokens"] == 0 and doc["streams"] == 0 and doc["lane"] is None
    assert 0.3 <= doc["wall_s"] < 30 and all(v > 0 for v in doc["cpu_s"].values())
    assert "idle for" in capsys.readouterr().out
