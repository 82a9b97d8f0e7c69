"""``sharding.cpus``: the compute / serving split of a CPU host, and placing a process on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sharding import cpus
from serve.config import load_config
from serve.errors import ConfigError


def test_cpu_lists_parse_like_the_kernels():
    assert cpus.parse_cpu_list("0-2,5\n") == [0, 1, 2, 5]
    assert cpus.parse_cpu_list("3") == [3]
    assert cpus.format_cpu_list([5, 0, 1]) == "0,1,5"
    for bad in ("", "a", "1-", "-1", "1,,2", "3-1", "1 2"):
        with pytest.raises(cpus.CpuSettingError):
            cpus.parse_cpu_list(bad)


def test_auto_keeps_vllms_rule_the_last_cpu_serves(monkeypatch):
    monkeypatch.setattr(cpus, "has_accelerator", lambda: False)
    assert cpus.plan("auto", [0, 1]) == cpus.CpuPlan(serving=(1,), compute=(0,))
    assert cpus.plan("auto", [4, 5, 6, 7]) == cpus.CpuPlan(serving=(7,), compute=(4, 5, 6))
    assert cpus.plan("6-7", list(range(8))) == cpus.CpuPlan(serving=(6, 7), compute=(0, 1, 2, 3, 4, 5))
    assert cpus.plan("1,9", [0, 1, 2]) == cpus.CpuPlan(serving=(1,), compute=(0, 2))  # CPUs it lacks: ignored
    # Nothing to split: off, one CPU, every CPU serving, or none of the node's.
    for setting, node in (("off", [0, 1]), ("auto", [0]), ("0-1", [0, 1]), ("5", [0, 1])):
        assert cpus.plan(setting, node) is None, (setting, node)
    monkeypatch.setenv(cpus.ENV, "auto")
    assert cpus.plan(cpus=[0, 1]) == cpus.CpuPlan(serving=(1,), compute=(0,))  # the replica's environment
    monkeypatch.delenv(cpus.ENV)
    assert cpus.plan(cpus=[0, 1]) is None  # unset: nothing placed (a process outside the application)


def test_a_node_with_a_gpu_is_left_to_the_os(monkeypatch):
    monkeypatch.setattr(cpus, "has_accelerator", lambda: True)
    assert cpus.plan("auto", [0, 1, 2, 3]) is None
    assert cpus.vllm_omp_bind("auto") is None


def test_the_config_names_a_bad_setting():
    assert load_config({"cpus": "6-7"}).cpus == "6-7"
    assert load_config(None).cpus == "auto"  # the default
    assert load_config({"cpus": False}).cpus == "off"  # what YAML makes of `cpus: off`
    with pytest.raises(ConfigError, match="cpus"):
        load_config({"cpus": "most of them"})


@pytest.mark.skipif(cpus.plan("auto") is None, reason="needs a CPU node with 2 or more CPUs")
def test_place_moves_every_thread_of_the_process():
    """A thread started before ``place`` moves too (Ray's and gRPC's threads exist before a replica's
    ``__init__``), and one started after inherits it; the vLLM bind names the other CPUs. The process
    starts on the serving CPUs, as a worker of a Ray that ``fastmode up`` started does."""
    p = cpus.plan("auto")
    code = textwrap.dedent("""
        import json, os, sys, threading
        from sharding import cpus
        stop = threading.Event()
        t = threading.Thread(target=stop.wait); t.start()
        placed = cpus.place(sys.argv[1], max_chips=int(sys.argv[2]))
        later = threading.Thread(target=stop.wait); later.start()
        masks = {tid: sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}
        stop.set()
        print(json.dumps([list(placed), len(masks), sorted({tuple(m) for m in masks.values()}), cpus.vllm_omp_bind()]))
    """)
    env = os.environ | {cpus.ENV: "auto"}
    everywhere = tuple(cpus.node_cpus())
    # A layout of more chips than compute cores: its chips may run anywhere, not where they started.
    for role, chips, want in (("serving", 1, p.serving), ("compute", 1, p.compute),
                              ("compute", len(p.compute) + 1, everywhere)):
        out = subprocess.run(["taskset", "-c", str(p.serving[0]), sys.executable, "-c", code, role, str(chips)],
                             env=env, capture_output=True, text=True, check=True).stdout
        placed, threads, masks, bind = json.loads(out)
        assert placed == list(want) and threads >= 3 and masks == [list(want)], out
        assert bind == cpus.format_cpu_list(p.compute)


def test_an_engines_gloo_threads_go_to_the_serving_cpus(tmp_path):
    """gloo's TCP loop threads (one per process group, waking every 10 ms) of a process below the
    caller move to the serving CPUs; its other threads stay on the compute ones. The child makes real
    gloo process groups (torch.distributed, world size 1), as vLLM's CPU engine does. A driver process
    of its own is the caller: this test process may have other children (a fixture's vLLM engines)."""
    p = cpus.plan("auto")
    if p is None:
        pytest.skip("a node with fewer than 2 CPUs, or with a GPU: nothing is placed")
    engine = textwrap.dedent(f"""
        import time
        from pathlib import Path
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
        dist.new_group([0], backend="gloo")
        Path("{tmp_path}/ready").write_text("")
        time.sleep(120)
    """)
    driver = textwrap.dedent(f"""
        import json, os, subprocess, sys, time
        from pathlib import Path
        from sharding import cpus
        child = subprocess.Popen(["taskset", "-c", {cpus.format_cpu_list(p.compute)!r}, sys.executable, "-c",
                                  {engine!r}])
        try:
            for _ in range(600):
                if Path("{tmp_path}/ready").exists() or child.poll() is not None:
                    break
                time.sleep(0.1)
            comms = {{tid: Path(f"/proc/{{child.pid}}/task/{{tid}}/comm").read_text().strip()
                     for tid in os.listdir(f"/proc/{{child.pid}}/task")}}
            off, auto = cpus.place_pollers(os.getpid(), "off"), cpus.place_pollers(os.getpid(), "auto")
            masks = {{tid: sorted(os.sched_getaffinity(int(tid))) for tid in comms}}
            print(json.dumps({{"comms": comms, "off": off, "auto": auto, "masks": masks}}))
        finally:
            child.kill()
            child.wait()
    """)
    out = json.loads(subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    assert (tmp_path / "ready").exists(), "the child made no process group"
    pollers = {tid for tid, comm in out["comms"].items() if comm in cpus.IDLE_POLLERS}
    assert len(pollers) >= 2, out["comms"]  # one per group
    assert out["off"] == 0 and out["auto"] == len(pollers), out
    for tid, comm in out["comms"].items():
        want = p.serving if tid in pollers else p.compute
        assert out["masks"][tid] == list(want), (comm, want, out["masks"][tid])


@pytest.mark.skipif(cpus.plan("auto") is None, reason="needs a CPU node with 2 or more CPUs")
def test_an_engine_thread_warms_up_on_every_cpu_then_moves_with_its_threads():
    """As the exact lane's engine thread does: in a replica placed on the serving CPUs, the thread runs
    on every CPU while it loads and compiles (``unplace``), so do the threads it starts, and then
    ``place_unplaced`` puts exactly those on the compute CPUs, the replica's own threads staying put.
    ``unplace()`` of the whole process (a chip, before it warms up) spreads every thread."""
    p = cpus.plan("auto")
    code = textwrap.dedent("""
        import json, os, sys, threading
        from sharding import cpus
        def mask():
            return sorted(os.sched_getaffinity(0))
        stop, seen = threading.Event(), {}
        def engine():
            seen["unplaced"] = list(cpus.unplace(this_thread=True))
            seen["engine_during"] = mask()
            helper = threading.Thread(target=lambda: (seen.setdefault("helper_during", mask()), stop.wait()))
            helper.start()
            while "helper_during" not in seen:
                pass
            seen["moved"] = cpus.place_unplaced("compute")
            seen["engine_after"] = mask()
            seen["helper_after"] = sorted(os.sched_getaffinity(helper.native_id))
            stop.set()
        t = threading.Thread(target=engine); t.start(); t.join()
        seen["main"] = mask()
        seen["whole"] = list(cpus.unplace())
        seen["main_after_whole"] = mask()
        print(json.dumps(seen))
    """)
    out = subprocess.run(["taskset", "-c", str(p.serving[0]), sys.executable, "-c", code],
                         env=os.environ | {cpus.ENV: "auto"}, capture_output=True, text=True, check=True).stdout
    seen = json.loads(out)
    every = sorted(cpus.node_cpus())
    assert seen["unplaced"] == every and seen["engine_during"] == every and seen["helper_during"] == every, seen
    assert seen["moved"] == 2, seen  # the engine thread and the one it started
    assert seen["engine_after"] == seen["helper_after"] == list(p.compute), seen
    assert seen["main"] == list(p.serving), seen  # the replica's own thread stayed
    assert seen["whole"] == every and seen["main_after_whole"] == every, seen
    off = subprocess.run([sys.executable, "-c", "from sharding import cpus; print(cpus.unplace(), "
                          "cpus.place_unplaced('compute'))"], env=os.environ | {cpus.ENV: "off"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert off == ["None", "0"]


def test_once_ready_the_daemons_go_to_the_serving_cpus():
    """``fastmode up``'s ``place_daemons``: the caller and its descendants' threads that run on every CPU
    (Ray's daemons, idle workers, Serve's controller) move to the serving CPUs; a process placed on
    purpose (an engine on the compute CPUs) stays, and so does a chip whose layout spreads it over
    every CPU (its title starts with ``ray::ChipWorker``, as Ray names a chip's process)."""
    p = cpus.plan("auto")
    if p is None:
        pytest.skip("a node with fewer than 2 CPUs, or with a GPU: nothing is placed")
    sleeper = "import time; time.sleep(60)"
    driver = textwrap.dedent(f"""
        import json, os, subprocess, sys, time
        from sharding import cpus
        daemon = subprocess.Popen([sys.executable, "-c", {sleeper!r}])
        engine = subprocess.Popen(["taskset", "-c", {cpus.format_cpu_list(p.compute)!r}, sys.executable, "-c",
                                   {sleeper!r}])
        chip = subprocess.Popen(["bash", "-c", 'exec -a "ray::ChipWorker.start" ' + sys.executable
                                 + ' -c "import time; time.sleep(60)"'])
        try:
            time.sleep(1.0)  # every child started (taskset has exec'd its python)
            off, auto = cpus.place_daemons(os.getpid(), "off"), cpus.place_daemons(os.getpid(), "auto")
            masks = {{name: sorted({{tuple(sorted(os.sched_getaffinity(int(t))))
                                   for t in os.listdir(f"/proc/{{pid}}/task")}})
                     for name, pid in (("driver", os.getpid()), ("daemon", daemon.pid), ("engine", engine.pid),
                                       ("chip", chip.pid))}}
            print(json.dumps({{"off": off, "auto": auto, "masks": masks}}))
        finally:
            for c in (daemon, engine, chip):
                c.kill()
                c.wait()
    """)
    out = json.loads(subprocess.run(["taskset", "-c", cpus.format_cpu_list(cpus.node_cpus()), sys.executable,
                                     "-c", driver], capture_output=True, text=True, check=True, timeout=60).stdout)
    every = sorted(cpus.node_cpus())
    assert out["off"] == 0 and out["auto"] >= 2, out  # the driver's threads and the daemon's
    assert out["masks"]["driver"] == out["masks"]["daemon"] == [list(p.serving)], out
    assert out["masks"]["engine"] == [list(p.compute)] and out["masks"]["chip"] == [every], out
