"""Which CPUs a node's processes run on, on a host without an accelerator: compute and serving cores.

vLLM's CPU worker binds its OpenMP threads to the cores of its NUMA node except the last one, which
it reserves "for other processes" (its scheduler process, the API frontend), and then leaves those
other processes wherever the OS puts them. On a small host the OS often puts them, and fastmode's
gateway, lane replicas and Ray's daemons, on the worker's core: each wake-up preempts the engine's
step, and a busy standard lane decodes markedly slower than with the serving processes kept off the
worker's core (docs/cpu-placement.md has the measurements).

So fastmode places its processes itself (``AppConfig.cpus``, carried to every replica in the
``FASTMODE_CPUS`` environment variable):

- **compute** cores: vLLM's model (its engine-core process, spawned on them by the lane replica, with
  the lanes' default ``executor: uni``; with ``mp``, its workers, ``VLLM_CPU_OMP_THREADS_BIND``) and
  the fast lane's chips (when the layout has no more chips than compute cores; else every CPU);
- **serving** cores: the gateway, the gRPC server, the lane replicas (and, with ``executor: mp``,
  vLLM's scheduler, EngineCore, which inherits them), Ray's daemons when ``fastmode up`` starts
  Ray itself (once the application is ready), and the engines' idle pollers (``IDLE_POLLERS``:
  gloo's threads, which never compute).

While they start, the engines fastmode builds (the fast lane's chips, the exact lane's engine
thread) load and compile on every CPU and are placed once warm (``unplace``, then ``place`` or
``place_unplaced``); Ray's daemons, started by ``fastmode up``, go to the serving CPUs once the
application is ready (``place_daemons``). Placed from the start, everything would load and compile on
one core, and the application would take much longer to start.

``auto`` keeps vLLM's own rule, the node's last CPU for serving and the rest for compute; a CPU list
(``"1"``, ``"6-7"``) names the serving CPUs; ``off`` leaves placement to the OS. Nothing is placed on
a node with fewer than 2 CPUs or with a GPU (its engines do not compute on these cores).
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

ENV = "FASTMODE_CPUS"
"""The environment variable every replica reads its setting from (``AppConfig.cpus``)."""

_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


class CpuSettingError(ValueError):
    """A ``cpus`` setting that is neither ``auto``, ``off`` nor a CPU list like ``"1"`` or ``"6-7,9"``."""


@dataclass(frozen=True)
class CpuPlan:
    """The node's CPUs split by role (both non-empty, disjoint)."""

    serving: tuple[int, ...]
    compute: tuple[int, ...]


def parse_cpu_list(text: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]`` (the kernel's cpulist format)."""
    text = text.strip()
    if not _LIST.match(text):
        raise CpuSettingError(f"not a CPU list: {text!r} (expected e.g. '1' or '6-7,9')")
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if hi and int(hi) < int(lo):
            raise CpuSettingError(f"not a CPU list: {text!r} ({part}: the range runs backwards)")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def format_cpu_list(cpus) -> str:
    """``[0, 1, 2, 5]`` -> ``"0,1,2,5"`` (what ``VLLM_CPU_OMP_THREADS_BIND`` takes)."""
    return ",".join(str(c) for c in sorted(cpus))


def validate(setting: str) -> str:
    """The setting if valid (``auto``, ``off`` or a CPU list), else ``CpuSettingError``."""
    if setting not in ("auto", "off"):
        parse_cpu_list(setting)
    return setting


def node_cpus() -> list[int]:
    """The CPUs this node (or container) may use: its cgroup's cpuset, else every online CPU.

    Not this process's affinity: a process already placed on the serving cores must still see the
    whole node."""
    for path in ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/devices/system/cpu/online"):
        try:
            return parse_cpu_list(Path(path).read_text())
        except (OSError, CpuSettingError):
            continue
    return list(range(os.cpu_count() or 1))


def has_accelerator() -> bool:
    """Whether this node has a GPU its engines compute on (then nothing is placed)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        return False
    return torch.cuda.is_available()


def plan(setting: str | None = None, cpus: list[int] | None = None) -> CpuPlan | None:
    """The split for ``setting`` (default: ``$FASTMODE_CPUS``, else ``off``) on ``cpus`` (default:
    ``node_cpus()``); ``None`` where nothing is placed."""
    setting = validate(os.environ.get(ENV, "off") if setting is None else setting)
    if setting == "off":
        return None
    cpus = sorted(node_cpus() if cpus is None else cpus)
    if len(cpus) < 2 or has_accelerator():
        return None
    serving = [cpus[-1]] if setting == "auto" else [c for c in parse_cpu_list(setting) if c in cpus]
    compute = [c for c in cpus if c not in serving]
    if not serving or not compute:
        return None
    return CpuPlan(tuple(serving), tuple(compute))


def place(role: Literal["serving", "compute"], setting: str | None = None, *, max_chips: int | None = None
          ) -> tuple[int, ...] | None:
    """Run this process (every thread it has now, and so the ones they start) on ``role``'s CPUs.

    ``max_chips``: for a chip, how many chips of its layout share the node: they are placed on the
    compute cores only if that many fit (one thread each), else spread over every CPU of the node
    (not left where they started: a worker of a Ray that ``fastmode up`` started inherits the serving
    CPUs). Returns the CPUs, or ``None`` where nothing was placed."""
    p = plan(setting)
    if p is None:
        return None
    cpus = p.serving if role == "serving" else p.compute
    if max_chips is not None and max_chips > len(cpus):
        cpus = tuple(node_cpus())
    _set_all_threads(cpus)
    return cpus


def unplace(setting: str | None = None, *, this_thread: bool = False) -> tuple[int, ...] | None:
    """Run this process (or, with ``this_thread``, the calling thread alone) on every CPU of the node,
    where placement is on: for what a chip or an engine does before it serves (loading, compiling, warming
    up), which then uses every core instead of the one it will serve on, with the compile workers it
    starts (they inherit it). ``place`` puts it on its cores afterwards. Returns the CPUs, or ``None``
    where nothing is placed."""
    if plan(setting) is None:
        return None
    cpus = tuple(node_cpus())
    if this_thread:
        os.sched_setaffinity(0, cpus)  # pid 0: the calling thread only, on Linux
    else:
        _set_all_threads(cpus)
    return cpus


def place_unplaced(role: Literal["serving", "compute"], setting: str | None = None) -> int:
    """Put this process's threads that run on every CPU of the node (``unplace``'s, and the threads
    they started) on ``role``'s CPUs, leaving the ones placed already. Returns how many moved."""
    p = plan(setting)
    if p is None:
        return 0
    return _move_unplaced(map(int, os.listdir("/proc/self/task")), p.serving if role == "serving" else p.compute)


def place_daemons(pid: int, setting: str | None = None, *, skip: tuple[str, ...] = ("ray::ChipWorker",)) -> int:
    """Put ``pid`` and its descendants' unplaced threads (those on every CPU of the node) on the serving
    CPUs: for ``fastmode up`` once its application is ready, so that Ray's daemons, its idle workers
    and Serve's controller start (and import) on every core and serve from the serving ones. Threads
    placed on purpose (a replica's, an engine's, a chip's) are left alone, as are the processes whose
    title starts with one of ``skip`` (chips whose layout does not fit the compute CPUs run on every
    CPU on purpose). Returns how many threads moved; 0 where nothing is placed."""
    p = plan(setting)
    if p is None:
        return 0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0
    moved = 0
    for proc in procs:
        try:
            if " ".join(proc.cmdline()).startswith(skip):
                continue
            tids = [t.id for t in proc.threads()]
        except psutil.Error:  # ended meanwhile
            continue
        moved += _move_unplaced(tids, p.serving)
    return moved


def _move_unplaced(tids, cpus) -> int:
    """Put the threads ``tids`` that run on every CPU of the node on ``cpus``; how many moved."""
    every, moved = set(node_cpus()), 0
    for tid in tids:
        try:
            if os.sched_getaffinity(tid) == every:
                os.sched_setaffinity(tid, cpus)
                moved += 1
        except OSError:  # a thread that ended meanwhile
            pass
    return moved


def _set_all_threads(cpus, per_thread: dict[str, set[int]] | None = None) -> None:
    """Every thread of this process on ``cpus`` (or on its own entry of ``per_thread``)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), (per_thread or {}).get(tid, cpus))
        except OSError:  # a thread that ended meanwhile
            pass


@contextmanager
def placed(role: Literal["serving", "compute"], setting: str | None = None):
    """``place`` for the duration of a block (a benchmark's in-process engines placed as the
    application's are), then this process's threads back on the CPUs they had."""
    before = {tid: os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")}
    try:
        yield place(role, setting)
    finally:
        _set_all_threads(node_cpus(), before)


IDLE_POLLERS = frozenset({"gloo_tcp_loop"})
"""Threads of an engine's processes that wake while idle and never compute a step here: gloo's TCP
loop (``gloo/transport/tcp/loop.cc``: ``epoll_wait`` with a 10 ms timeout), one per process group
vLLM makes, 13 per engine at world size 1, about 1,300 wake-ups a second each engine. On the compute
cores they preempt the model's step, so they go to the serving core (docs/cpu-placement.md)."""


def place_pollers(pid: int, setting: str | None = None) -> int:
    """Put the idle pollers (``IDLE_POLLERS``) of ``pid``'s descendants on the serving CPUs (after an
    engine started them: a process group's thread exists once the group does). Returns how many
    threads moved; 0 where nothing is placed."""
    p = plan(setting)
    if p is None:
        return 0
    moved = 0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            tids = [t.id for t in child.threads()]
        except psutil.Error:  # ended meanwhile
            continue
        for tid in tids:
            try:
                if Path(f"/proc/{child.pid}/task/{tid}/comm").read_text().strip() in IDLE_POLLERS:
                    os.sched_setaffinity(tid, p.serving)
                    moved += 1
            except OSError:
                pass
    return moved


def vllm_omp_bind(setting: str | None = None) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` for a vLLM engine on this node: its compute cores (``None``:
    vLLM's own ``auto``)."""
    p = plan(setting)
    return format_cpu_list(p.compute) if p else None

