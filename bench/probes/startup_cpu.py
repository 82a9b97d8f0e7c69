"""Where the CPU goes while ``fastmode up`` starts: CPU seconds per role in each window, until ready.

Starts the command (default ``fastmode up --port PORT`` with any further arguments after ``--``),
reads every process's CPU time every ``--window`` seconds (``bench.cpu_profile.snapshot``: each
Serve deployment, its engine processes, the fast lane's chips, Ray's daemons; the command itself
and what it starts without a role of its own count as ``started command``) until its output has
``--ready`` (``fastmode up`` prints ``ready in``), then stops it (SIGINT, as Ctrl-C) and prints the
busiest roles per window and the totals until ready.

On a machine with few cores the lanes' engines, compiles and warm-ups start side by side and take
the CPU from each other: this says which one the start waits on.

Usage: python -m bench.probes.startup_cpu [--window 5] [--timeout 600] [--log FILE] [--json FILE]
                                          [-- COMMAND ...]
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.app import REPO, free_port
from bench.cpu_profile import per_role, snapshot

MINE = "started command"


def watch(command: list[str], log: Path, ready: str, window: float, timeout: float) -> dict:
    """Run ``command`` (its output to ``log``) and read CPU per role every ``window`` s until ``ready``
    is in its output, it exits, or ``timeout`` s pass; then stop it."""
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    t0, prev, windows, total = time.perf_counter(), snapshot(MINE), [], defaultdict(float)
    state, seconds = "timeout", None
    try:
        while time.perf_counter() - t0 < timeout:
            time.sleep(window)
            cur = snapshot(MINE)
            used = {role: s for role, s in per_role(prev, cur).items() if s > 0}
            prev = cur
            windows.append({"at_s": time.perf_counter() - t0, "cpu_s": used})
            for role, s in used.items():
                total[role] += s
            if ready in log.read_text(errors="replace"):
                state = "ready"
                break
            if proc.poll() is not None:
                state = f"exited ({proc.returncode})"
                break
    finally:
        seconds = time.perf_counter() - t0  # until ready (or exit, or the timeout), not until stopped
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return {"command": shlex.join(command), "state": state, "seconds": seconds,
            "window_s": window, "windows": windows, "cpu_s_until_end": dict(total)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ours, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(prog="python -m bench.probes.startup_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=float, default=5.0, help="seconds per window (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    ap.add_argument("--ready", default="ready in", help="the output line that says the start is over "
                    "(default %(default)r, fastmode up's)")
    ap.add_argument("--log", type=Path, help="the command's output (default: a temporary file)")
    ap.add_argument("--json", type=Path, help="also write every window's figures here")
    args = ap.parse_args(ours)
    if args.window <= 0:
        ap.error("--window must be positive")
    if not command or command[0].startswith("-"):  # none, or only arguments for fastmode up
        command = [sys.executable, "-m", "clients.cli", "up", "--port", str(free_port()), *command]
    log = args.log or Path(tempfile.mkdtemp()) / "startup.log"
    doc = watch(command, log, args.ready, args.window, args.timeout)
    for w in doc["windows"]:
        top = sorted(w["cpu_s"].items(), key=lambda kv: -kv[1])[:6]
        print(f"{w['at_s']:6.1f} s  " + "  ".join(f"{role[:22]}={s:.1f}" for role, s in top if s >= 0.05), flush=True)
    print(f"{doc['state']} after {doc['seconds']:.1f} s; CPU seconds by role until then:")
    for role, s in sorted(doc["cpu_s_until_end"].items(), key=lambda kv: -kv[1]):
        print(f"  {s:7.2f}  {role}")
    print(f"output: {log}")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if doc["state"] == "ready" else 1


if __name__ == "__main__":
    raise SystemExit(main())
