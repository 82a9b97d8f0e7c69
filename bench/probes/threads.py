"""Which threads run, wait and wake up: every thread on the machine over a window, by role.

Reads each thread's counters from ``/proc`` at the start and the end of ``--seconds``: its CPU time
(``stat``: user + system), the time it waited runnable for a CPU (``schedstat``: run-queue wait),
its voluntary context switches (it slept and was woken: wake-ups) and its involuntary ones (it was
preempted). Threads are grouped by their process's role as ``bench.cpu_profile`` names it (each
Serve deployment, its engine processes, the fast lane's chips, Ray's daemons, ...).

On an idle application this says what keeps the cores awake between requests (a thread that wakes
a thousand times a second costs a core's caches even at 1% CPU); under a load, whose threads wait
for a CPU and how long (run-queue wait against run time), which the CPU totals alone do not show.

Usage: python -m bench.probes.threads [--seconds 10] [--top 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

from bench.cpu_profile import snapshot

TICK = os.sysconf("SC_CLK_TCK")


def _thread(task: Path) -> tuple[str, float, int, int, int, int] | None:
    """(name, CPU seconds, run ns, run-queue wait ns, voluntary, involuntary switches) or ``None``."""
    try:
        stat = (task / "stat").read_text()
        run_ns, wait_ns, _ = map(int, (task / "schedstat").read_text().split())
        status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
    except (OSError, ValueError):
        return None  # gone meanwhile, or a kernel without schedstat
    name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    return (name, cpu, run_ns, wait_ns, int(status["voluntary_ctxt_switches"]),
            int(status["nonvoluntary_ctxt_switches"]))


def threads() -> dict[tuple[int, int], tuple]:
    """(pid, tid) -> ``_thread``'s counters of every thread on the machine."""
    out = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            for task in (proc / "task").glob("[0-9]*"):
                if (t := _thread(task)) is not None:
                    out[(int(proc.name), int(task.name))] = t
    return out


def measure(seconds: float) -> dict:
    """Per role and per thread over ``seconds``: CPU % of a core, run-queue wait % of a core, wake-ups
    and preemptions per second."""
    roles = {pid: role for pid, (role, _) in snapshot(mine="this probe").items()}
    before, t0 = threads(), time.perf_counter()
    time.sleep(seconds)
    after, wall = threads(), time.perf_counter() - t0
    per_role: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    rows = []
    for key, (name, cpu, run_ns, wait_ns, vol, invol) in after.items():
        if key not in before:
            continue
        _, cpu0, _, wait0, vol0, invol0 = before[key]
        row = {"cpu_pct": 100 * (cpu - cpu0) / wall, "wait_pct": 100 * (wait_ns - wait0) / 1e9 / wall,
               "wakeups_per_s": (vol - vol0) / wall, "preemptions_per_s": (invol - invol0) / wall}
        if not any(row.values()):
            continue
        role = roles.get(key[0], "other")
        for k, v in row.items():
            per_role[role][k] += v
        rows.append({"role": role, "pid": key[0], "tid": key[1], "thread": name, **row})
    rows.sort(key=lambda r: -r["wakeups_per_s"])
    return {"seconds": wall, "cores": os.cpu_count(), "roles": {k: dict(v) for k, v in per_role.items()},
            "threads": rows}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="python -m bench.probes.threads", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="the window (default %(default)s)")
    ap.add_argument("--top", type=int, default=20, help="threads listed, most wake-ups first (default %(default)s)")
    ap.add_argument("--json", type=Path, help="also write every role's and thread's figures here")
    args = ap.parse_args(argv)
    if args.seconds <= 0:
        ap.error("--seconds must be positive")
    doc = measure(args.seconds)
    print(f"{doc['seconds']:.1f} s, {doc['cores']} cores; % of one core")
    print(f"{'role':32s} {'cpu %':>7s} {'wait %':>7s} {'wake-ups/s':>10s} {'preempted/s':>11s}")
    for role, r in sorted(doc["roles"].items(), key=lambda kv: -kv[1]["cpu_pct"]):
        print(f"{role[:32]:32s} {r['cpu_pct']:7.2f} {r['wait_pct']:7.2f} {r['wakeups_per_s']:10.1f} "
              f"{r['preemptions_per_s']:11.1f}")
    print(f"\nthreads, most wake-ups first:\n{'role':28s} {'thread':16s} {'cpu %':>7s} {'wait %':>7s} {'wake-ups/s':>10s}")
    for r in doc["threads"][:args.top]:
        print(f"{r['role'][:28]:28s} {r['thread'][:16]:16s} {r['cpu_pct']:7.2f} {r['wait_pct']:7.2f} "
              f"{r['wakeups_per_s']:10.1f}")
    if args.json:
        doc["command"] = " ".join(["python -m bench.probes.threads", *argv])
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
