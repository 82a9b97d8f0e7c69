"""Single-stream decode speed: our executor (tp=pp=1) against vLLM, same checkpoint, same machine.

``python -m bench.executor_vs_vllm [--model models/fast] [--tokens 256] [--repeats 3] [--json OUT]``

Each engine runs in its own subprocess (vLLM's engine processes stay out of ours). Decode speed
is measured the same way for both: the time of a generation of N tokens minus the time of a
generation of 1 token (prefill plus first token), divided by N - 1; best of ``--repeats``, after
a warm-up. vLLM is measured in the configurations a user would try (its default multiprocess
engine and the in-process one; bf16 and fp32) and the fastest is the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from models import FAST

REPO = Path(__file__).resolve().parents[1]
PROMPT = "import os\n\n\ndef read_lines(path):\n"


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up (compilation, allocator)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def run_ours(path: str, tokens: int, repeats: int, compile_: bool) -> dict:
    import torch

    from sharding.engine import Engine
    from sharding.sampling import SamplingParams
    from transformers import AutoTokenizer

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    prompt = AutoTokenizer.from_pretrained(path)(PROMPT).input_ids
    engine = Engine.from_pretrained(path, num_slots=1, compile=compile_)

    def gen(n: int):
        return lambda: engine.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))

    t1, tn = _timed(gen(1), repeats), _timed(gen(tokens), repeats)
    return {"engine": "fastmode executor" + (" + torch.compile" if compile_ else ""), "dtype": "float32",
            "first_token_s": t1, "decode_tokens_per_s": (tokens - 1) / (tn - t1)}


def run_vllm(path: str, tokens: int, repeats: int, dtype: str) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(model=path, dtype=dtype, kv_cache_memory_bytes=64 * 2**20, gpu_memory_utilization=0.1, seed=0,
              max_num_seqs=1)

    def gen(n: int):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        return lambda: llm.generate([PROMPT], params, use_tqdm=False)

    t1, tn = _timed(gen(1), repeats), _timed(gen(tokens), repeats)
    mp = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"
    return {"engine": f"vLLM ({'multiprocess' if mp else 'in-process'} engine)", "dtype": dtype,
            "first_token_s": t1, "decode_tokens_per_s": (tokens - 1) / (tn - t1)}


def _subprocess(kind: str, args: argparse.Namespace, extra: str, env: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "bench.executor_vs_vllm", "--worker", kind, "--model", str(args.model),
           "--tokens", str(args.tokens), "--repeats", str(args.repeats), "--extra", extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"engine": kind, "extra": extra, "error": proc.stderr[-2000:]}
    return json.loads(lines[-1][7:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.executor_vs_vllm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=FAST)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--extra", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "ours":
        print("RESULT " + json.dumps(run_ours(str(args.model), args.tokens, args.repeats, args.extra == "compile")))
        return 0
    if args.worker == "vllm":
        print("RESULT " + json.dumps(run_vllm(str(args.model), args.tokens, args.repeats, args.extra)))
        return 0
    results = [
        _subprocess("ours", args, "eager"),
        _subprocess("ours", args, "compile"),
        _subprocess("vllm", args, "bfloat16"),
        _subprocess("vllm", args, "float32"),
        _subprocess("vllm", args, "float32", {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
    ]
    ok = [r for r in results if "error" not in r]
    ours = max((r for r in ok if r["engine"].startswith("fastmode")), key=lambda r: r["decode_tokens_per_s"])
    vllm = max((r for r in ok if r["engine"].startswith("vLLM")), key=lambda r: r["decode_tokens_per_s"])
    summary = {"model": str(args.model), "tokens": args.tokens, "results": results,
               "ratio_best_ours_over_best_vllm": ours["decode_tokens_per_s"] / vllm["decode_tokens_per_s"]}
    for r in results:
        if "error" in r:
            print(f"{r['engine']:<40} ERROR {r['error'][-300:]}")
        else:
            print(f"{r['engine']:<40} {r['dtype']:<9} {r['decode_tokens_per_s']:>8.0f} tokens/s  "
                  f"first token {r['first_token_s'] * 1e3:.1f} ms")
    print(f"best ours / best vLLM: {summary['ratio_best_ours_over_best_vllm']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
