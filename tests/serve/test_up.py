"""``fastmode up``: health only once every engine has loaded, a clean exit on Ctrl-C, and a lane
that cannot start named with its cause.

Runs last in ``tests/serve`` (``tests/conftest.py`` orders it; it stops the shared application)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from bench.app import free_port
from tests.serve.conftest import REPO, eager_lanes


@pytest.mark.slow
def test_health_is_ready_only_once_every_engine_has_loaded(app):
    a = app()
    loading = [(s, b) for s, b in a.health_before_ready if b is not None]
    # The gateway answers within a second or two; vLLM takes tens of seconds to load.
    assert any(s == 503 for s, _ in loading), a.health_before_ready
    for status, body in loading:
        lanes = body["lanes"]
        assert (status == 200) == all(lane["ready"] for lane in lanes.values()), body
        for lane in lanes.values():  # a lane is ready only with an engine to report on
            assert lane["ready"] == ("running" in lane), lane
    status, body = a.health()
    assert status == 200 and body["status"] == "ok"
    for lane in ("fast", "priority", "standard", "exact"):
        assert body["lanes"][lane]["ready"] and body["lanes"][lane]["running"] == 0
    models = a.client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["fastmode-full", "fastmode-fast", "auto"]
    # While lanes warm up, /health says which (starting) and /v1/models is not yet ready.
    assert any(b["status"] == "starting" and any(lane.get("starting") for lane in b["lanes"].values())
               for s, b in loading), loading
    assert a.models_before_ready and a.models_before_ready[0] == 503, a.models_before_ready


@pytest.mark.slow
def test_right_after_ready_every_lanes_first_request_is_served_at_full_speed(app):
    """Warm-up happens at startup (every lane replica serves its own warm-up requests before it
    counts as ready), not on the first user's request: tried as a new user would, one request per
    lane in turn on one WebSocket right after ``fastmode up`` printed its URLs. The shared app runs
    the fast and exact lanes eager (``tests/conftest.py``): that their compiled warm-ups leave no
    graph to compile on a request is tested in process (``test_after_the_warm_up_no_batch_compiles_again``
    in ``tests/sharding/test_engine.py``, ``test_packed.py`` and ``test_speculative.py``)."""
    a = app()
    assert set(a.first_requests) == {"fast", "priority", "standard", "exact"}, a.first_requests
    slow = {lane: s for lane, s in a.first_requests.items() if s > 1.0}
    assert not slow, f"first token later than 1 s after readiness: {a.first_requests}"
    for lane in a.first_requests:
        warm = a.lane_stats(lane)["warmup"]
        assert warm is not None and len(warm["requests_s"]) == 2, warm


@pytest.mark.slow
def test_the_default_fast_lane_deploys_the_planners_layout(app):
    import os

    from models import TEST_FAST
    from sharding.planner import auto_layout

    a = app()
    layout = a.lane_stats("fast")["layout"]
    from serve.config import FastLaneConfig

    # fastmode up: one chip per core; the lane's dtype (float32), not the checkpoint's, sizes its shards
    best, _ = auto_layout(TEST_FAST, chips=os.cpu_count(), device="cpu", dtype=FastLaneConfig().dtype)
    assert (layout["tp"], layout["pp"]) == (best.tp, best.pp) and layout["why"].startswith("auto:")
    out = "".join(a.output)
    assert f"(lane: fast, tp={best.tp} x pp={best.pp}: auto: the planner's pick on {os.cpu_count()} chip(s)" in out


@pytest.mark.slow
def test_the_default_lanes_on_our_executor_decode_from_packed_weights(app):
    # packed_weights: auto (sharding.packed) turns on wherever the kernel runs; every linear of the
    # shipped checkpoints packs (they are bfloat16 values). The outputs are checked against
    # transformers in tests/sharding/test_packed.py and on the served lanes in test_lanes.py.
    import torch

    from models import TEST_FAST, TEST_FULL
    from sharding import packed
    from sharding.weights import load_model

    a = app()
    count = {p: sum(type(m) is torch.nn.Linear for m in load_model(p).modules()) for p in (TEST_FULL, TEST_FAST)}
    on = packed.unavailable_reason() is None
    assert sum(a.lane_stats("fast")["packed_linears"]) == (count[TEST_FAST] if on else 0)
    assert a.lane_stats("exact")["packed_linears"] == ({"target": count[TEST_FULL], "draft": count[TEST_FAST]} if on
                                                       else {"target": 0, "draft": 0})


@pytest.mark.slow
def test_ctrl_c_stops_everything_it_started(app):
    import psutil

    a = app()
    started = psutil.Process(a.proc.pid).children(recursive=True)  # Ray, replicas, engines, chips
    assert any("VLLM::EngineCore" in " ".join(p.cmdline()) for p in started)
    assert a.stop(signal.SIGINT) == 0, "".join(a.output[-40:])
    out = "".join(a.output)
    assert "fastmode up: stopping" in out and "fastmode up: stopped" in out
    _, alive = psutil.wait_procs(started, timeout=30)  # only this app's: other apps may run on the machine
    assert not alive, f"processes left behind: {[(p.pid, p.name()) for p in alive]}"


@pytest.mark.slow
@pytest.mark.full  # an application of its own, waited on until its lane gives up (minutes)
def test_a_lane_that_cannot_start_is_named_with_its_root_cause(tmp_path):
    """vLLM's CPU attention takes blocks of a multiple of 32 only; its engine process says so, and the
    replica only "engine core initialization failed". ``fastmode up`` exits 1 naming the lane and the cause."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("16-token blocks are valid on a GPU")
    config = tmp_path / "bad.yaml"
    # one failed start fails the deployment (Serve's default tries the engine 3 times, ~40 s each here)
    config.write_text(eager_lanes() + "  priority: {block_size: 16, max_constructor_retry_count: 1}\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"FASTMODE_API_KEYS": "sk-x"}
    ports = [str(free_port()) for _ in range(3)]
    r = subprocess.run([sys.executable, "-m", "clients.cli", "up", "--config", str(config), "--port", ports[0],
                        "--grpc-port", ports[1], "--metrics-port", ports[2]], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    report = r.stderr[r.stderr.index("fastmode up: the application did not deploy"):]
    assert "  priority-lane: ValueError: No common block size for 16" in report, report
    assert "full tracebacks: " in report and "Traceback" not in report
