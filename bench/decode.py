"""Batch-1 decode in process on the full model: fastmode's executor against llama.cpp's ``llama-bench``
on the same weights with the same threads, vLLM's engine beside them, and where a token's time goes.

``fastmode bench decode [--threads 2] [--tokens 128] [--rounds 3] [--no-vllm] [--quick] [--json OUT]``

1. fastmode: ``sharding.Engine`` on the full checkpoint (``bench.pair``) as the exact tier and a
   single-chip lane run it: ``torch.compile`` and packed bfloat16 weights (``sharding.packed``; the
   checkpoint's bfloat16 values, float32 arithmetic), one slot. Its start-up (load, compile and
   ``sharding.stage.warm_up``) is timed. Each round decodes ``--tokens`` greedy tokens (``ignore_eos``)
   after a 5-token prompt; tokens/s counts from the first token.
2. llama.cpp: ``llama-bench -p 0 -n TOKENS -t THREADS`` (tg128 at the default) on the same checkpoint
   as a GGUF of the same precision (``bench.llama_cpp.to_gguf``: bfloat16 stays bfloat16), rounds
   alternating with fastmode's, so that the machine's drift falls on both.
3. vLLM: its engine in process as the priority lane builds it (``bench.vllm_executor`` in a
   subprocess, ``--dtype bfloat16``), one stream, for reference.
4. The profile: one more fastmode round under ``torch.profiler``, each op's self time per token,
   grouped: the head's matrix (``vocab x hidden``), the layers' linears, the compiled graph's own
   kernels (norms, RoPE, attention, activations), Dynamo's guard checks, sampling, and the rest of
   the step (the scheduler's Python), with the bytes of weights each token streams and the rate the
   linears stream them at.

Without a llama.cpp build (``python -m bench.llama_cpp build``) its rows are skipped with the reason;
``--quick`` (a smoke run) decodes eager, 16 tokens, 1 round, without vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import torch

PROMPT_IDS = [1, 504, 3060, 28, 198]
"""Five token ids every vocabulary of the shipped pairs holds; the prompt is not what is measured."""


def fastmode_engine(path: Path, threads: int, compile: bool = True):
    """(engine, start-up seconds): the executor on ``path`` as it decodes for a lane, warmed up
    (``compile=False``: eager, no warm-up, as ``--quick`` runs it)."""
    from sharding.engine import Engine
    from sharding.stage import warm_up

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    engine = Engine.from_pretrained(path, num_slots=1, max_len=512, compile=compile, packed_weights=True)
    if compile:
        warm_up(engine)
    return engine, time.perf_counter() - t0


def decode_round(engine, tokens: int) -> float:
    """Tokens/s of one greedy ``tokens``-token decode, from its first token."""
    from sharding.sampling import SamplingParams

    engine.add(f"r{time.perf_counter_ns()}", PROMPT_IDS,
               SamplingParams(temperature=0, max_tokens=tokens + 1, ignore_eos=True))
    n, first = 0, None
    while engine.has_work:
        for out in engine.step():
            n += len(out.token_ids)
            first = first or time.perf_counter()
    return (n - 1) / (time.perf_counter() - first)


def llama_bench(gguf: Path, tokens: int, threads: int) -> float:
    """llama.cpp's own decode rate (``tgN``) on ``gguf``, one repetition."""
    from bench import llama_cpp

    cmd = [str(llama_cpp.bin_dir() / "llama-bench"), "-m", str(gguf), "-p", "0", "-n", str(tokens),
           "-r", "1", "-t", str(threads), "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=llama_cpp.env(), timeout=900, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def vllm_decode(path: Path, tokens: int, threads: int) -> dict:
    """vLLM's engine in process on ``path`` (``bench.vllm_executor``, one stream), or why it did not run."""
    cmd = [sys.executable, "-m", "bench.vllm_executor", "--model", str(path), "--dtype", "bfloat16",
           "--lane", "priority", "--streams", "1", "--tokens", str(tokens), "--rounds", "3", "--threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode or not lines:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:] or ["exit %d" % r.returncode]}
    return json.loads(lines[-1])


def profile(engine, tokens: int) -> dict:
    """Where one round's time goes, per token (``torch.profiler``, self times of each op)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model = engine.executor.runner.model
    vocab = model.config.vocab_size
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        decode_round(engine, tokens)
        wall = time.perf_counter() - t0
    groups: dict[str, float] = defaultdict(float)
    for e in prof.key_averages(group_by_input_shape=True):
        us = e.self_cpu_time_total
        name = e.key
        if name == "fastmode::linear_bf16w" or name in ("aten::linear", "aten::mm", "aten::addmm"):
            shapes = e.input_shapes or []
            out_dim = next((s[0] for s in shapes[1:] if len(s) == 2), None) if name != "fastmode::linear_bf16w" \
                else (shapes[1][0] * shapes[1][2] if len(shapes) > 1 and len(shapes[1]) == 3 else None)  # [N/16, K, 16]
            groups["head (vocab x hidden)" if out_dim == vocab else "layers' linears"] += us
        elif name.startswith("## Call CompiledFxGraph"):
            groups["compiled graph's own kernels (norms, RoPE, attention, activations)"] += us
        elif "Cache Lookup" in name or "Pregraph" in name or "AOTDispatcher" in name or "Compiled Region" in name:
            groups["Dynamo guards and graph entry"] += us
        elif name in ("aten::argmax", "aten::topk", "aten::softmax", "aten::multinomial", "aten::_local_scalar_dense"):
            groups["sampling"] += us
        else:
            groups["other ops (views, empty, copies)"] += us
    per_token = {k: v / 1e3 / tokens for k, v in groups.items()}
    step_ms = wall * 1e3 / tokens
    per_token["the step's Python (scheduler, outputs)"] = max(0.0, step_ms - sum(per_token.values()))
    weight_bytes = sum(m.packed.numel() * m.packed.element_size() for m in model.modules()
                       if isinstance(getattr(m, "packed", None), torch.Tensor))
    linear_ms = per_token.get("head (vocab x hidden)", 0) + per_token.get("layers' linears", 0)
    return {"tokens": tokens, "step_ms": step_ms, "per_token_ms": dict(sorted(per_token.items(), key=lambda kv: -kv[1])),
            "weight_bytes_per_token": weight_bytes,
            "linears_gb_per_s": weight_bytes / (linear_ms / 1e3) / 1e9 if linear_ms else None,
            "head_macs_per_token": vocab * model.config.hidden_size}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fastmode bench decode", description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="threads for both (default 2)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM's engine")
    ap.add_argument("--quick", action="store_true", help="eager, 16 tokens, 1 round, no vLLM (a smoke run)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.rounds, args.no_vllm = 16, 1, True

    from bench import llama_cpp, pair
    from bench.llama_cpp_serve import gguf_path, tensor_types
    from bench.suite import machine

    full = pair.full()
    doc = {"command": "fastmode bench decode" + (" " + " ".join(argv) if argv else ""),
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "model": full.name,
           "settings": {"threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
                        "prompt_ids": PROMPT_IDS, "torch": torch.__version__, "machine": machine()},
           "skipped": {}}
    doc["settings"]["compiled"] = not args.quick
    engine, doc["fastmode_start_s"] = fastmode_engine(full, args.threads, compile=not args.quick)
    gguf = None
    if llama_cpp.bin_dir() is None:
        doc["skipped"]["llama.cpp"] = "not built here (python -m bench.llama_cpp build)"
    else:
        try:
            gguf = llama_cpp.to_gguf(full, gguf_path(full))
            doc["gguf"] = {"file": gguf.name, "tensor_types": tensor_types(gguf)}
        except llama_cpp.LlamaCppUnavailable as e:
            doc["skipped"]["llama.cpp"] = f"{type(e).__name__}: {e}"
    decode_round(engine, 8)  # the first round after warm-up pays for lazy first-use costs
    ours, theirs = [], []
    for r in range(args.rounds):
        ours.append(decode_round(engine, args.tokens))
        if gguf is not None:
            theirs.append(llama_bench(gguf, args.tokens, args.threads))
        print(f"round {r + 1}/{args.rounds}: fastmode {ours[-1]:.1f} tok/s"
              + (f", llama-bench {theirs[-1]:.1f}" if theirs else ""), flush=True)
    doc["fastmode_tokens_per_s"] = ours
    doc["llama_bench_tokens_per_s"] = theirs
    doc["ratio_median"] = statistics.median(ours) / statistics.median(theirs) if theirs else None
    doc["profile"] = profile(engine, args.tokens)
    del engine
    if args.no_vllm:
        doc["skipped"]["vLLM"] = "--no-vllm" + (" (--quick)" if args.quick else "")
    else:
        doc["vllm"] = vllm_decode(full, args.tokens, args.threads)
    text = json.dumps(doc, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
