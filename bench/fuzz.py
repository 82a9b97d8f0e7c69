"""``fastmode bench fuzz``: the hostile-input fuzz of every front door, run long.

``make test`` runs ``tests/serve/test_fuzz.py`` with 25 examples per front door (under a minute). This
runs the same tests with ``--examples`` per front door (default 200; ``--quick`` 10): they start
their own application (``fastmode up``, the embedded default config, an API key required), so
nothing else may be running on the machine. Each front door (the WebSocket's frames, the JSON bodies
of the OpenAI routes and ``/v1/generate``, gRPC's messages) must answer every input with a typed
error, a documented close code or a valid response (never a 5xx, a crash or a hang); afterwards every
lane must be idle (no engine slot leaked) and a normal request served. The test module's docstring has
the whole property.

Writes ``--json``: per front door its inputs, how each was answered, its seconds and its verdict, and
the seed Hypothesis printed for a failure. Exits 1 if any front door failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = "tests/serve/test_fuzz.py"
DOORS = {"test_websocket_frames": "websocket", "test_http_bodies": "http", "test_grpc_messages": "grpc"}


def run(examples: int, timeout_s: float, tests: str = TESTS) -> dict:
    """Run the fuzz tests (``tests``) with ``examples`` per front door; their verdicts and tallies."""
    with tempfile.TemporaryDirectory(prefix="fastmode-fuzz-") as tmp:
        tally, junit = Path(tmp) / "tally.jsonl", Path(tmp) / "junit.xml"
        env = dict(os.environ, FASTMODE_FUZZ_EXAMPLES=str(examples), FASTMODE_FUZZ_TALLY=str(tally))
        cmd = [sys.executable, "-m", "pytest", tests, "-p", "no:cacheprovider", "-q", f"--junitxml={junit}"]
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
            output, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            output, rc = f"{e.stdout or ''}{e.stderr or ''}\ntimed out after {timeout_s:.0f} s", None
        seconds = time.perf_counter() - t
        tallies = {}
        if tally.exists():
            for line in tally.read_text().splitlines():
                row = json.loads(line)
                tallies[row.pop("front_door")] = row
        verdicts = _verdicts(junit) if junit.exists() else {}
    doors = {}
    for test, door in DOORS.items():
        verdict = verdicts.get(test, {"result": "not run"})
        doors[door] = {**tallies.get(door, {}), **verdict}
    return {"examples_per_front_door": examples, "seconds": seconds, "exit_code": rc, "front_doors": doors,
            "output_tail": output[-4000:] if rc != 0 else ""}


def _verdicts(junit: Path) -> dict[str, dict]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        result = "failed" if failure is not None else "skipped" if skipped is not None else "passed"
        row = {"result": result, "test_seconds": float(case.get("time", 0))}
        if failure is not None:
            row["failure"] = (failure.get("message") or "")[:1000]
        out[case.get("name")] = row
    return out


def print_table(result: dict) -> None:
    print(f"\n{'front door':<10} {'result':<8} {'inputs':>7} {'seconds':>8}  answers")
    for door, row in result["front_doors"].items():
        answers = ", ".join(f"{k} {v}" for k, v in list(row.get("answers", {}).items())[:6])
        print(f"{door:<10} {row['result']:<8} {row.get('inputs', '-'):>7} {row.get('seconds', '-'):>8}  {answers}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="fastmode bench fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=200, help="Hypothesis examples per front door")
    ap.add_argument("--timeout-s", type=float, default=3600, help="give up on the whole run after this long")
    ap.add_argument("--quick", action="store_true", help="10 examples per front door")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.examples < 1:
        ap.error("--examples must be at least 1")
    started = time.strftime("%Y-%m-%d %H:%M")
    result = run(10 if args.quick else args.examples, args.timeout_s)
    result = {"date": started, "command": shlex.join(["fastmode", "bench", "fuzz", *argv]),
              "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()}, **result}
    print_table(result)
    if result["exit_code"] != 0:
        print(result["output_tail"], file=sys.stderr)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["exit_code"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
