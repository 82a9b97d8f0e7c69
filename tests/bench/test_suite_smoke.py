"""``fastmode bench all --quick`` (what ``make bench`` runs, in its tiny setting) on the shared
application: every stage runs, writes its results, and the report is made from them."""

from __future__ import annotations

import json
import math
import os

import pytest

from bench.app import REPO
from bench.netem import can_emulate
from bench.report import write_report
from bench.suite import STAGES, main
from bench.turns import THINK_MS
from serve.config import StandardLaneConfig

pytestmark = pytest.mark.slow


@pytest.fixture
def speed(monkeypatch) -> dict:
    """The machine's speed as the suite probes it (``bench.machine_speed.probe``): the test sets
    ``speed["gb_per_s"]``."""
    import bench.suite as suite

    now = {"gb_per_s": 10.0}
    monkeypatch.setattr(suite.machine_speed, "probe", lambda **kw: dict(now))
    return now


def test_every_stage_ran(quick_run):
    out, seconds = quick_run
    suite = json.loads((out / "suite.json").read_text())
    assert suite["quick"] and list(suite["stages"]) == [s for s in STAGES if s != "fuzz"]
    assert all(s["exit_code"] == 0 for s in suite["stages"].values()), suite["stages"]
    assert suite["commit"]["sha"] and len(suite["commit"]["sha"]) == 40
    assert suite["machine"]["cpu_count"] == os.cpu_count()
    assert suite["app"] == {"url": suite["app"]["url"], "started_here": False}
    assert suite["sitting_speeds"][0]["gb_per_s"] > 0  # bench.machine_speed, at the sitting's start
    assert all(s["machine_gb_per_s_after"] > 0 and s["sitting"] == 1 for s in suite["stages"].values())
    assert seconds < 600  # the issue asks < 3 min for --quick on an idle machine; CI shares it with other work


def test_report(quick_run):
    out, _ = quick_run
    text = (out / "benchmarks.md").read_text()
    for heading in ("## 1. Lanes under load", "## 2. Quality against speed", "## 3. Gateway", "## 4. Sharding",
                    "## 5. What users would pick instead", "## 6. Multi-turn", "## 7. Soak"):
        assert heading in text
    assert text.count("Not run") == 1 and "## 8. Hostile input at every front door\n\nNot run." in text  # skipped
    assert "**failed" not in text
    assert "**Quick run**" in text and "fastmode bench all --quick" in text
    assert str(out) not in text and "--out OUT" in text  # no machine path: the results directory is OUT
    # every table row in the report comes from the JSON: the lanes' aggregate tokens/s appear as written
    lanes = json.loads((out / "lanes_load.json").read_text())["lanes"]
    assert f"{lanes['standard'][0]['aggregate_tokens_per_s']:.0f}" in text
    assert write_report(out, out / "again.md") == text.replace(str(out / "benchmarks.md"), str(out / "again.md"))


def test_vllm_baseline(quick_run):
    out, _ = quick_run
    doc = json.loads((out / "vllm_serve.json").read_text())
    assert set(doc["lanes"]) == {"ray-serve-llm-full"}  # --quick: Ray Serve LLM (paired starts vLLM's server)
    for name, rows in doc["lanes"].items():
        assert [r["concurrency"] for r in rows] == [1, 2]
        for r in rows:
            assert r["completed"] == r["concurrency"] and not r["errors"] and r["output_tokens"] == 16 * r["completed"]
            assert math.isfinite(r["per_user_decode_tokens_per_s"]["p50"]) and r["aggregate_tokens_per_s"] > 0
    (cmd,) = doc["settings"]["server_commands"].values()
    assert "-m bench.ray_serve_llm" in cmd and "--port PORT" in cmd
    assert set(doc["greedy"]) == {"ray-serve-llm-full"}  # compared with transformers in test_ray_serve_llm.py
    assert not list(out.glob("vllm_serve_*.log")) or all(p.stat().st_size > 0 for p in out.glob("vllm_serve_*.log"))


def test_vllm_server_command_has_the_lanes_memory_and_dtype():
    from bench.vllm_serve import CHECKPOINTS, server_command
    from serve.lanes.vllm_sizing import vllm_sizes

    lane = StandardLaneConfig()
    for name in ("full", "fast", "full-spec"):
        cmd = server_command(name, 1234)
        sizes = vllm_sizes(json.loads((CHECKPOINTS[name][1]() / "config.json").read_text()), lane)
        assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and "--enforce-eager" in cmd
        assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(sizes["kv_cache_memory_bytes"])
        assert cmd[cmd.index("--dtype") + 1] == lane.dtype
    assert "--speculative-config" in server_command("full-spec", 1)
    assert "--speculative-config" not in server_command("full", 1)


def test_gateway(quick_run):
    out, _ = quick_run
    doc = json.loads((out / "gateway.json").read_text())
    for lane in ("fast", "standard"):
        assert doc["served"]["decode_tokens_per_s"][lane] > 0 and doc["in_process"]
        assert math.isfinite(doc["overhead_ms_per_token"][lane])
    assert doc["in_process"]["sharded_fast_compiled"] is False  # --quick: eager, no compile of its own
    trio = doc["served"]["ttft_ms"]
    assert set(trio) == {"warm_websocket", "fresh_websocket", "fresh_http_sse", "health_round_trip"}
    # Loopback's limit: its round trip, measured as an emulated one is, plus the engine's first token.
    assert 0 < doc["loopback_rtt_ms"] < 20
    assert doc["loopback_physical_limit_ms"] == pytest.approx(doc["loopback_rtt_ms"] + doc["engine_ttft_ms"])
    # The warm WebSocket's first token against the engine's own, in alternating blocks of each.
    alt, direct = doc["loopback_warm_alternated"], doc["in_process"]
    # The served sides: the gateway and the door, each timed by the blocking client and the asyncio one.
    assert set(direct["served_ttft_samples_s"]) == {"gateway", "door", "door_asyncio", "gateway_asyncio"}
    for samples in direct["served_ttft_samples_s"].values():
        assert len(samples) == len(direct["sharded_fast_ttft_samples_s"]) == alt["samples_per_side"]
        assert all(0 < x < 5 for x in samples)
    assert alt["samples_per_side"] >= alt["rounds"] > 1
    assert alt["physical_limit_ms"] == pytest.approx(doc["loopback_physical_limit_ms"])
    assert alt["ratio"] == pytest.approx(alt["warm_websocket"]["p50"] / alt["physical_limit_ms"])
    assert alt["door_ratio"] == pytest.approx(alt["door_warm_websocket"]["p50"] / alt["physical_limit_ms"])
    for key in ("ratio", "door_ratio"):
        assert alt["asyncio_client"][key] > 0
    assert direct["sharded_fast_options"]["prefix_cache"] == "True"  # the ring as the lane runs it
    # The standard lane's single stream, alternated with vLLM in process (3 rounds with --quick).
    one = doc["single_stream_alternated"]
    assert one["rounds"] == len(one["ratios"]) == len(direct["served_decodes"]) == len(direct["vllm_full_decodes"]) == 3
    assert one["ratios"] == pytest.approx([a / b for a, b in zip(direct["served_decodes"], direct["vllm_full_decodes"])])
    assert one["ratio"] == pytest.approx(sorted(one["ratios"])[1])
    assert doc["throughput_ceiling"]["concurrency"] == 4 and doc["throughput_ceiling"]["ratio"] > 0
    assert doc["throughput_ceiling"]["ratio_interval"] is None  # --quick: one round, too few for an interval
    if can_emulate() is None:  # root: the namespace was built and the 20 ms round trip is visible
        (net,) = doc["emulated_network"]
        assert net["rtt_ms"] == 20 and 20 <= net["measured_rtt_ms"] < 40  # the echo crosses the emulated delay
        assert net["physical_limit_ms"] == pytest.approx(net["measured_rtt_ms"] + doc["engine_ttft_ms"])
        assert net["physical_limit_nominal_rtt_ms"] == pytest.approx(20 + doc["engine_ttft_ms"])
        # ... and with the engine's first token after the ring idled one round trip (20 ms before each)
        assert net["engine_ttft_after_idle_ms"] == pytest.approx(1e3 * direct["sharded_fast_ttft_after_idle_s"]["0.02"])
        assert net["physical_limit_engine_idle_ms"] == pytest.approx(net["measured_rtt_ms"]
                                                                     + net["engine_ttft_after_idle_ms"])
        assert "after that long idle" in (out / "benchmarks.md").read_text()
        assert net["ttft_ms"]["health_round_trip"]["p50"] >= 20
        assert net["ttft_ms"]["warm_websocket"]["p50"] >= 20
        assert net["ttft_ms"]["fresh_websocket"]["p50"] >= 40  # connect + upgrade: at least two round trips
    else:
        assert doc["emulated_network"] == [] and "root" in doc["emulated_network_skipped"]


def test_turns(quick_run):
    out, _ = quick_run
    doc = json.loads((out / "turns.json").read_text())
    assert doc["settings"]["turns"] == 4 and set(doc["loopback"]) == {"fast", "standard"}
    for lane, r in doc["loopback"].items():
        assert r["conversations"] == 2
        for way in ("websocket", "http_resend"):
            w = r[way]
            assert len(w["ttft_ms_per_turn"]) == 4 and all(t > 0 for t in w["ttft_ms_per_turn"])
            assert w["wall_s"] > 0 and w["input_tokens_last_turn"] > 0
        # both ways send the same conversation: the last turn's prompt is the same length
        assert r["websocket"]["input_tokens_last_turn"] == r["http_resend"]["input_tokens_last_turn"], lane
        assert r["wall_ratio"] == pytest.approx(r["websocket"]["wall_s"] / r["http_resend"]["wall_s"])
    # the fast lane's prefix cache: the last turn over the WebSocket reused its history
    assert doc["loopback"]["fast"]["websocket"]["cached_tokens_per_turn"][-1] > 0
    assert doc["settings"]["think_ms"] == THINK_MS
    for r in doc["loopback"].values():  # the lane's own first token: part of the client's, turn by turn
        own, client = r["websocket"]["engine_ttft_ms_per_turn"], r["websocket"]["ttft_ms_per_turn"]
        assert len(own) == 4 and all(0 < o <= c for o, c in zip(own, client))
        assert "engine_ttft_ms_per_turn" not in r["http_resend"]


def test_soak(quick_run):
    out, _ = quick_run
    doc = json.loads((out / "soak.json").read_text())
    assert doc["passed"], doc["checks"]
    assert doc["ledger"]["requests"] >= 40 and doc["ws"]["streams"] == 20  # a reset connection ends its streams early
    assert doc["memory"]["ratio"] is not None  # the shared app runs on this machine


def test_sharding(quick_run):
    out, _ = quick_run
    doc = json.loads((out / "sharding.json").read_text())
    assert [(r["tp"], r["pp"]) for r in doc["layouts"]] == [(1, 1), (1, 2)]
    one, two = doc["layouts"]
    # One chip samples itself (no hop); two close the ring: the stage hop and the tokens back.
    assert one["hops"] == {} and two["hops"].keys() == {"0->1", "1->0"}
    assert two["hops"]["0->1"]["bytes"] == 128 * 4 and two["hops"]["1->0"]["bytes"] == 8
    assert all(r["tokens_per_s"] > 0 and r["predicted_tokens_per_s"] > 0 for r in doc["layouts"])
    assert doc["planner_choice"]["tp"] * doc["planner_choice"]["pp"] <= doc["planner_choice"]["chips"]


def test_bad_stage_name(capsys):
    with pytest.raises(SystemExit):
        main(["--only", "lanes,nope"])
    assert "unknown stage(s) ['nope']" in capsys.readouterr().err


def test_only_a_full_run_into_bench_results_replaces_the_published_report(tmp_path):
    """A partial run (``--only``, ``--skip``, ``--out``, ``--quick``) writes its report beside its
    results, never over ``docs/benchmarks.md``."""
    from argparse import Namespace

    from bench.suite import REPO, report_path

    def where(quick=False, out=None, only=None, skip=()):
        return report_path(Namespace(quick=quick, out=out, only=only, skip=list(skip)), out or tmp_path / "default")

    assert where() == REPO / "docs/benchmarks.md"
    assert where(out=tmp_path) == where(out=tmp_path, only=["gateway", "turns"]) == tmp_path / "benchmarks.md"
    assert where(skip=["fuzz"]) == where(only=["gateway"]) == where(quick=True) == tmp_path / "default/benchmarks.md"


def test_resume_keeps_finished_stages_and_refuses_another_commit(tmp_path, monkeypatch, speed, capsys):
    """``--resume`` reruns only what an incomplete run of the same commit did not finish, and
    refuses a run of another commit, a dirty tree, or a complete run."""
    import types

    import bench.report
    import bench.suite as suite

    ran: list[str] = []
    codes = {"decode": 1}  # the first sitting's decode stage fails

    def fake_run(cmd, **kw):
        name = cmd[2].removeprefix("bench.")
        ran.append(name)
        return types.SimpleNamespace(returncode=codes.get(name, 0))

    monkeypatch.setattr(suite, "subprocess", types.SimpleNamespace(run=fake_run))
    monkeypatch.setattr(bench.report, "write_report", lambda out, docs: None)
    head = {"sha": "a" * 40, "dirty": False, "code": "c1"}
    monkeypatch.setattr(suite, "commit", lambda: dict(head))
    args = ["--only", "sharding,decode", "--out", tmp_path]

    assert suite.main(["--resume", *args]) == 2  # nothing to resume yet
    assert "no " in capsys.readouterr().err and ran == []
    assert suite.main(args) == 1
    assert ran == ["sharding", "decode"]
    first = json.loads((tmp_path / "suite.json").read_text())
    assert first["complete"] is True and first["stages"]["decode"]["exit_code"] == 1

    first["complete"] = False  # as a run cut short after its stages leaves it
    (tmp_path / "suite.json").write_text(json.dumps(first))
    ran.clear()
    codes.clear()
    assert suite.main(["--resume", *args]) == 0
    assert ran == ["decode"]  # sharding finished in the first sitting and is kept
    second = json.loads((tmp_path / "suite.json").read_text())
    assert second["complete"] is True and second["stages"]["sharding"] == first["stages"]["sharding"]
    assert second["stages"]["decode"]["exit_code"] == 0 and len(second["sittings"]) == 2
    assert second["command"] == first["command"] and list(second["stages"]) == ["sharding", "decode"]
    assert "2 sittings" in "\n".join(bench.report.header(second))

    assert suite.main(["--resume", *args]) == 2  # complete: nothing to resume
    assert "is complete" in capsys.readouterr().err
    second["complete"] = False
    (tmp_path / "suite.json").write_text(json.dumps(second))
    head["code"] = "c2"  # another commit whose measured code differs
    head["sha"] = "b" * 40
    assert suite.main(["--resume", *args]) == 2
    assert "measured other code (commit " + "a" * 40 in capsys.readouterr().err
    head.update(sha="a" * 40, code="c1", dirty=True)
    assert suite.main(["--resume", *args]) == 2
    assert "uncommitted changes" in capsys.readouterr().err
    head["dirty"] = False
    assert suite.main(["--resume", "--only", "sharding", "--out", tmp_path]) == 2  # other settings
    assert "has command" in capsys.readouterr().err


def test_resume_continues_on_a_later_commit_of_the_same_measured_code(tmp_path, monkeypatch, speed):
    """A sitting's results committed (a new commit, the same measured code) leave the run resumable;
    the report names both sittings' commits."""
    import types

    import bench.report
    import bench.suite as suite

    ran: list[str] = []
    monkeypatch.setattr(suite, "subprocess", types.SimpleNamespace(
        run=lambda cmd, **kw: ran.append(cmd[2]) or types.SimpleNamespace(returncode=0)))
    monkeypatch.setattr(bench.report, "write_report", lambda out, docs: None)
    head = {"sha": "a" * 40, "dirty": False, "code": "same"}
    monkeypatch.setattr(suite, "commit", lambda: dict(head))
    args = ["--only", "sharding,decode", "--out", tmp_path]
    assert suite.main(args) == 0
    first = json.loads((tmp_path / "suite.json").read_text())
    first["complete"] = False
    del first["stages"]["decode"]  # cut short after sharding
    (tmp_path / "suite.json").write_text(json.dumps(first))
    ran.clear()
    head["sha"] = "b" * 40
    assert suite.main(["--resume", *args]) == 0 and ran == ["bench.decode"]
    second = json.loads((tmp_path / "suite.json").read_text())
    assert second["sitting_commits"] == ["a" * 40, "b" * 40]
    assert "at commits `aaaaaaaaaaaa`, `bbbbbbbbbbbb` of the same measured code" in "\n".join(bench.report.header(second))


def test_measured_code_ignores_docs_tests_and_results(tmp_path):
    """``measured_code`` is the same across commits that change only docs, tests, results or the
    report, and differs once the code a run measures changes."""
    import subprocess

    from bench.suite import commit

    def git(*a):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path, check=True,
                       capture_output=True)

    for f in ("bench/unpublished/suite.json", "docs/a.md", "tests/test_a.py", "bench/pair.py", "bench/report.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("a\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "x")
    first = commit(tmp_path)
    for f in ("bench/unpublished/suite.json", "docs/a.md", "tests/test_a.py", "bench/report.py"):
        (tmp_path / f).write_text("b\n")
    assert commit(tmp_path)["dirty"] is False
    git("commit", "-qam", "results and docs")
    second = commit(tmp_path)
    assert second["sha"] != first["sha"] and second["code"] == first["code"]
    (tmp_path / "bench/pair.py").write_text("b\n")
    assert commit(tmp_path)["dirty"] is True
    git("commit", "-qam", "code")
    assert commit(tmp_path)["code"] != first["code"]


def test_publish_replaces_the_published_files_and_writes_the_report(tmp_path, monkeypatch):
    """A complete run is published whole: its files replace bench/results' (a stale one it lacks is
    removed), the report and the README's table are written from them, scratch is left behind."""
    import bench.report
    from bench import headline
    from bench.suite import PUBLISHED, publish

    out, results = tmp_path / "unpublished", tmp_path / "results"
    out.mkdir()
    results.mkdir()
    (out / "suite.json").write_text("{}")
    (out / "app.log").write_text("scratch")
    (results / "suite.json").write_text("old")
    (results / "fuzz.json").write_text("old")
    written = []
    monkeypatch.setattr(bench.report, "write_report", lambda r, d: written.append(("report", r, d)))
    monkeypatch.setattr(headline, "rows", lambda r: [])
    monkeypatch.setattr(headline, "update_readme", lambda readme, table: written.append(("readme", readme)))
    publish(out, results, tmp_path / "benchmarks.md", tmp_path / "README.md")
    assert (results / "suite.json").read_text() == "{}" and not (results / "fuzz.json").exists()
    assert not (results / "app.log").exists() and not out.exists()
    assert written == [("report", results, tmp_path / "benchmarks.md"), ("readme", tmp_path / "README.md")]
    kept = {line[len("!bench/results/"):] for line in (REPO / ".gitignore").read_text().splitlines()
            if line.startswith("!bench/results/")}
    assert kept == set(PUBLISHED)  # git keeps exactly what a publish copies


def test_a_runs_own_results_do_not_make_the_checkout_dirty(tmp_path):
    """The results a run writes into the checkout (bench/results, docs/benchmarks.md) leave it clean,
    so a run cut short can ``--resume``; a change to the code does not."""
    import subprocess

    from bench.suite import commit

    def git(*a):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "bench/results").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    for f in ("bench/results/suite.json", "docs/benchmarks.md", "bench/pair.py"):
        (tmp_path / f).write_text("a\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "x")
    assert commit(tmp_path)["dirty"] is False and len(commit(tmp_path)["sha"]) == 40
    (tmp_path / "bench/results/suite.json").write_text("b\n")
    (tmp_path / "docs/benchmarks.md").write_text("b\n")
    assert commit(tmp_path)["dirty"] is False
    (tmp_path / "bench/pair.py").write_text("b\n")
    assert commit(tmp_path)["dirty"] is True


def test_an_app_that_does_not_start_fails_its_stages_and_the_rest_still_run(tmp_path, monkeypatch, speed):
    """``fastmode up`` failing (or its exact lane not compiling in time) fails every stage that needed
    it, with the reason; the stages after it still run and the run is written complete."""
    import contextlib
    import types

    import bench.report
    import bench.suite as suite

    ran: list[str] = []
    monkeypatch.setattr(suite, "subprocess", types.SimpleNamespace(
        run=lambda cmd, **kw: ran.append(cmd[2].removeprefix("bench.")) or types.SimpleNamespace(returncode=0)))
    monkeypatch.setattr(bench.report, "write_report", lambda out, docs: None)
    monkeypatch.setattr(suite, "commit", lambda: {"sha": "a" * 40, "dirty": False})

    @contextlib.contextmanager
    def no_app(**kw):
        raise suite.AppFailed("the exact lane did not run compiled in time:\n(its log)")
        yield

    monkeypatch.setattr(suite, "running_app", no_app)
    assert suite.main(["--only", "sharding,lanes,quality,fuzz", "--out", tmp_path]) == 1
    assert ran == ["sharding", "fuzz"]
    doc = json.loads((tmp_path / "suite.json").read_text())
    assert doc["complete"] is True and "did not run compiled" in doc["app"]["error"]
    for name in ("lanes", "quality"):
        assert doc["stages"][name]["exit_code"] is None
        assert doc["stages"][name]["error"] == "the app did not start: the exact lane did not run compiled in time:"
    assert doc["stages"]["sharding"]["exit_code"] == doc["stages"]["fuzz"]["exit_code"] == 0


def test_resume_refuses_a_machine_of_another_speed_and_a_fresh_run_drops_the_quality_journal(
        tmp_path, monkeypatch, speed, capsys):
    """The stages of one run compare like for like only on a machine of one speed: ``--resume``
    refuses a sitting whose probe moved beyond ``TOLERANCE`` from the first sitting's, and goes on
    within it. The quality stage keeps its journal beside the results; a run started over removes it."""
    import types

    import bench.report
    import bench.suite as suite
    from bench.machine_speed import TOLERANCE
    from bench.quality import Journal

    commands: list[list[str]] = []
    monkeypatch.setattr(suite, "subprocess", types.SimpleNamespace(
        run=lambda cmd, **kw: commands.append(cmd) or types.SimpleNamespace(returncode=0)))
    monkeypatch.setattr(bench.report, "write_report", lambda out, docs: None)
    monkeypatch.setattr(suite, "commit", lambda: {"sha": "a" * 40, "dirty": False, "code": "c"})
    monkeypatch.setattr(suite, "running_app", lambda **kw: (_ for _ in ()).throw(AssertionError("no app here")))
    args = ["--only", "sharding,decode,quality", "--url", "http://127.0.0.1:1", "--out", tmp_path]
    stale = Journal(tmp_path).path("standard")
    stale.write_text("{}\n")  # an earlier run's
    assert suite.main(args) == 0 and not stale.exists()
    assert ["--journal", str(tmp_path)] == commands[-1][-2:] and commands[-1][2] == "bench.quality"
    first = json.loads((tmp_path / "suite.json").read_text())
    assert first["sitting_speeds"] == [{"gb_per_s": 10.0}]
    first["complete"] = False
    del first["stages"]["quality"]  # cut short in quality: its journal stays for the next sitting
    (tmp_path / "suite.json").write_text(json.dumps(first))
    stale.write_text("{}\n")

    speed["gb_per_s"] = 10.0 * (1 - TOLERANCE) - 0.5  # the machine got slower
    assert suite.main(["--resume", *args]) == 2
    err = capsys.readouterr().err
    assert "0.80x the speed of the run's first sitting (8.00 GB/s against 10.00" in err and "start over" in err
    assert stale.exists()

    speed["gb_per_s"] = 10.0 * (1 + TOLERANCE) - 0.5  # within the tolerance
    commands.clear()
    assert suite.main(["--resume", *args]) == 0 and [c[2] for c in commands] == ["bench.quality"]
    assert stale.exists()  # the resumed quality stage reads it (and removes it once done)
    second = json.loads((tmp_path / "suite.json").read_text())
    assert [s["gb_per_s"] for s in second["sitting_speeds"]] == [10.0, 11.0]
    assert second["stages"]["quality"]["sitting"] == 2 and second["stages"]["sharding"]["sitting"] == 1
