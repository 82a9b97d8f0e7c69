"""Where the exact tier should run: speculative decoding of the full model, the fast model drafting,
in vLLM and in fastmode's executor, against each one's plain decoding.

One stream, greedy, ``--tokens`` tokens after each of ``--prompts`` code prompts, every
configuration in its own subprocess (vLLM's engine processes stay out of ours), one after the
other, alone on the machine:

- vLLM ``LLM`` on ``models/full`` (the lanes' settings), plain, then with
  ``speculative_config={"method": "draft_model", "model": models/fast, "num_speculative_tokens": k}``;
- fastmode's executor (``sharding.engine.Engine``, ``torch.compile``) on ``models/full``, plain,
  then ``sharding.speculative.SpeculativeEngine`` with ``k`` fixed and adaptive, with float32
  weights and then with packed bfloat16 ones (``sharding.packed``: what the lanes run where the
  kernel builds), whose outputs must equal the float32 engine's; with ``--draft-vocab N``, also
  with the draft's head pruned to its ``N`` most frequent tokens (``sharding.draft_vocab``).

For each: tokens/s per user (all tokens of a request over its wall time, median over prompts and
repeats, after a warm-up), drafts accepted per draft, tokens per verify step, and whether every
output is token for token the plain greedy output of the same engine.

The pair is the test pair unless ``--full``/``--fast`` name another (the default pair:
``--full builtin:smollm2-135m-instruct --fast models/fast``); ``--chat`` sends the prompts as chat
requests through the full model's chat template (an instruct pair's usual input) instead of raw code.

Usage: fastmode bench speculative [--tokens 128] [--prompts 4] [--repeats 2] [--ks 1,2,4]
                                  [--full PATH --fast PATH] [--chat] [--draft-vocab N[,N]]
                                  [--no-packed | --packed-only] [--only-ours] [--no-compile] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from models import TEST_FAST, TEST_FULL

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["import os\n\n\ndef read_lines(path):\n", "class Stack:\n    def __init__(self):\n",
           "def fibonacci(n):\n", "# Parse the command line\nimport argparse\n\n",
           "def merge_sorted(a, b):\n", "for i in range(10):\n"]
CHAT_PROMPTS = ["Write a Python function that reads a file and returns its lines without trailing newlines.",
                "Explain how a hash table works, with an example.",
                "Write a Python class Stack with push, pop and peek methods, and explain each one.",
                "Give three tips for writing clear technical documentation, with a short example of each.",
                "Write a Python function that merges two sorted lists into one sorted list.",
                "Explain the difference between a process and a thread."]


def _paths(args: argparse.Namespace) -> tuple[Path, Path]:
    """The pair's checkpoint folders (``builtin:`` names and student folders resolved)."""
    from models.builtin import resolve

    full = resolve(args.full) if args.full else TEST_FULL
    fast = resolve(args.fast, full=full) if args.fast else TEST_FAST
    return Path(full), Path(fast)


def _prompt_ids(full: Path, n: int, chat: bool) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(full)
    if not chat:
        return [tok(p).input_ids for p in PROMPTS[:n]]
    if not tok.chat_template:
        raise SystemExit(f"fastmode bench speculative: --chat needs a chat template; {full} has none")
    return [list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)) for p in CHAT_PROMPTS[:n]]


def _measure(generate, prompts: list[list[int]], repeats: int) -> tuple[list[list[int]], list[float]]:
    outs = [generate(p) for p in prompts]  # warm-up (compilation), and the outputs compared
    rates = []
    for _ in range(repeats):
        for p in prompts:
            t = time.perf_counter()
            out = generate(p)
            rates.append(len(out) / (time.perf_counter() - t))
    return outs, rates


def run_vllm(k: int, tokens: int, prompts: list[list[int]], repeats: int, full: Path = TEST_FULL,
             fast: Path = TEST_FAST) -> dict:
    from vllm import LLM, SamplingParams, TokensPrompt

    from bench.ray_serve_llm import engine_kwargs
    from serve.config import PriorityLaneConfig

    kw = {**engine_kwargs(PriorityLaneConfig(), full), "disable_log_stats": False}
    if k:
        kw["speculative_config"] = {"method": "draft_model", "model": str(fast), "num_speculative_tokens": k}
    llm = LLM(model=str(full), **{k_: v for k_, v in kw.items() if v is not None})
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)

    def generate(ids):
        return list(llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0].outputs[0].token_ids)

    outs, rates = _measure(generate, prompts, repeats)
    m = {x.name: getattr(x, "value", None) for x in llm.get_metrics()}
    drafts, drafted = m.get("vllm:spec_decode_num_drafts"), m.get("vllm:spec_decode_num_draft_tokens")
    accepted = m.get("vllm:spec_decode_num_accepted_tokens")
    return {"engine": "vLLM", "k": k, "outputs": outs, "tokens_per_s": rates,
            "acceptance": accepted / drafted if drafted else None,
            "tokens_per_verify": (accepted + drafts) / drafts if drafts else None}


def run_ours(k: int, adaptive: bool, tokens: int, prompts: list[list[int]], repeats: int,
             packed: bool = False, compile: bool = True, draft_vocab: int | None = None,
             full: Path = TEST_FULL, fast: Path = TEST_FAST) -> dict:
    import torch

    from sharding.engine import Engine
    from sharding.sampling import SamplingParams
    from sharding.speculative import SpeculativeEngine

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    if k:
        engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=1, k=k, adaptive=adaptive, compile=compile,
                                                   packed_weights=packed, draft_vocab_size=draft_vocab)
    else:
        engine = Engine.from_pretrained(full, num_slots=1, compile=compile, packed_weights=packed)
    outs, rates = _measure(lambda ids: engine.generate([ids], params)[0], prompts, repeats)
    stats = getattr(engine, "stats", None)
    return {"engine": "fastmode executor" + (", packed bf16" if packed else ""), "k": k, "adaptive": adaptive,
            "draft_vocab": len(engine.draft_vocab) if k and engine.draft_vocab is not None else None,
            "outputs": outs, "tokens_per_s": rates,
            "acceptance": stats.acceptance if stats else None,
            "tokens_per_verify": stats.tokens_per_round if stats else None,
            "final_k": engine.k if k else None,
            # the last requests' smoothed seconds per forward: one verify of k + 1 tokens, one draft step
            "verify_ms": 1e3 * engine._t_verify if k else None, "draft_step_ms": 1e3 * engine._t_draft if k else None}


def _subprocess(args: argparse.Namespace, worker: str) -> dict:
    cmd = [sys.executable, "-m", "bench.speculative", "--worker", worker, "--tokens", str(args.tokens),
           "--prompts", str(args.prompts), "--repeats", str(args.repeats), *(["--no-compile"] if args.no_compile else []),
           *(["--full", args.full] if args.full else []), *(["--fast", args.fast] if args.fast else []),
           *(["--chat"] if args.chat else [])]
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1200, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"worker": worker, "error": proc.stderr[-2000:]}
    return {"worker": worker, **json.loads(lines[-1][7:])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fastmode bench speculative", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ks", default="1,2,4", help="fixed numbers of drafts to try")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-packed", action="store_true", help="skip the packed-weights runs")
    ap.add_argument("--packed-only", action="store_true", help="fastmode's engine with packed weights only "
                    "(what the lanes run where the kernel builds), not also with float32 weights")
    ap.add_argument("--only-ours", action="store_true", help="skip vLLM's runs")
    ap.add_argument("--no-compile", action="store_true", help="fastmode's executor eager (smoke runs; its "
                    "figures are not the lane's)")
    ap.add_argument("--full", help="the full model (a folder, GGUF or builtin:NAME; default: the test pair's)")
    ap.add_argument("--fast", help="the fast model (a folder or student folder; default: the test pair's)")
    ap.add_argument("--chat", action="store_true", help="chat prompts through the full model's chat template")
    ap.add_argument("--draft-vocab", default="", help="also run fastmode's engine with the draft's head pruned "
                    "to these numbers of tokens (comma-separated; needs the fast model's token_counts.json)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, k, mode, dv = args.worker.split(":")
        full, fast = _paths(args)
        prompts = _prompt_ids(full, args.prompts, args.chat)
        r = (run_vllm(int(k), args.tokens, prompts, args.repeats, full, fast) if kind == "vllm"
             else run_ours(int(k), mode == "adaptive", args.tokens, prompts, args.repeats, packed=kind == "packed",
                           compile=not args.no_compile, draft_vocab=int(dv) or None, full=full, fast=fast))
        print("RESULT " + json.dumps(r))
        return 0
    ks = [int(k) for k in args.ks.split(",") if k.strip()]
    vocabs = [int(v) for v in args.draft_vocab.split(",") if v.strip()]
    from sharding.packed import unavailable_reason

    ours = ["ours"] + (["packed"] if unavailable_reason() is None and not args.no_packed else [])
    if args.packed_only:
        if "packed" not in ours:
            ap.error(f"--packed-only: the packed kernel cannot run here ({unavailable_reason() or '--no-packed'})")
        ours = ["packed"]
    workers = ([f"vllm:{k}:fixed:0" for k in [0, *ks]]
               + [w for kind in ours for w in [f"{kind}:{k}:fixed:0" for k in [0, *ks]] + [f"{kind}:{max(ks)}:adaptive:0"]
                  + [f"{kind}:{k}:fixed:{v}" for v in vocabs for k in ks] + [f"{kind}:{max(ks)}:adaptive:{v}" for v in vocabs]])
    if args.only_ours:
        workers = [w for w in workers if not w.startswith("vllm")]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = [_subprocess(args, w) for w in workers]
    plain = {r["engine"]: r["outputs"] for r in results if "error" not in r and r["k"] == 0}
    print(f"{'engine':<32} {'k':>9} {'tok/s p50':>9} {'vs plain':>8} {'accept':>7} {'tok/verify':>10} identical (to fp32)")
    base = {}
    for r in results:
        if "error" in r:
            print(f"{r['worker']:<30} ERROR {r['error'][-400:]}")
            continue
        r["tokens_per_s_p50"] = statistics.median(r["tokens_per_s"])
        base.setdefault(r["engine"], r["tokens_per_s_p50"])
        r["speedup_over_plain"] = r["tokens_per_s_p50"] / base[r["engine"]]
        r["identical_to_plain"] = r["outputs"] == plain.get(r["engine"])
        r["identical_to_fastmode_float32"] = r["outputs"] == plain.get("fastmode executor")
        k = f"{r['k']}{' adapt' if r.get('adaptive') else ''}{' v' + str(r['draft_vocab']) if r.get('draft_vocab') else ''}"
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        tpv = "-" if r["tokens_per_verify"] is None else f"{r['tokens_per_verify']:.2f}"
        print(f"{r['engine']:<32} {k:>9} {r['tokens_per_s_p50']:>9.0f} {r['speedup_over_plain']:>7.2f}x "
              f"{acc:>7} {tpv:>10} {r['identical_to_plain']} ({r['identical_to_fastmode_float32']})")
        if r.get("verify_ms") and not r.get("adaptive"):
            # Every draft accepted: k + 1 tokens per round of one verify and k draft steps.
            k_, plain_ms = r["k"], 1e3 / base[r["engine"]]
            r["speedup_if_all_accepted"] = (k_ + 1) * plain_ms / (r["verify_ms"] + k_ * r["draft_step_ms"])
            print(f"{'':<32} {'':>9} verify {r['verify_ms']:.2f} ms, draft step {r['draft_step_ms']:.2f} ms, plain "
                  f"{plain_ms:.2f} ms/token: {r['speedup_if_all_accepted']:.2f}x if every draft were accepted")
        del r["outputs"]
    if args.json:
        doc = {"benchmark": "speculative decoding, vLLM against fastmode's executor",
               "command": " ".join(["fastmode bench speculative", *map(str, argv if argv is not None else sys.argv[1:])]),
               "date": started, "machine": {"cpu_count": os.cpu_count()},
               "settings": {"tokens": args.tokens, "repeats": args.repeats, "chat": args.chat,
                            "prompts": (CHAT_PROMPTS if args.chat else PROMPTS)[:args.prompts],
                            "greedy": True, "target": args.full or "the test pair's full model",
                            "draft": args.fast or "the test pair's fast model", "draft_vocab": vocabs,
                            "compile": not args.no_compile},
               "results": results}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
