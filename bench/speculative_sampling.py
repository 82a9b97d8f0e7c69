"""Does speculative decoding (vLLM's, and fastmode's own) keep the full model's distribution when it samples?

The exact tier promises the full model's own output: greedy, token for token; sampled, the same
distribution (the rejection rule of speculative sampling). This samples ``--samples`` continuations
of one code prompt at temperature 1 (a seed each) from vLLM's ``LLM`` on ``models/full``, plain and
with vLLM's ``draft_model`` speculative decoding (``models/fast`` drafting k = 3), and from fastmode's
own executor (``sharding.speculative``, the exact lane's default engine, the same k), in
subprocesses, then scores every sample under the full model in transformers: the mean log-probability
per sampled token, with its 95% interval. Two samplers of one distribution agree on it within the
intervals (it estimates the negative entropy of the model's continuations).

Usage: python -m bench.speculative_sampling [--samples 200] [--tokens 24] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from models import TEST_FAST, TEST_FULL

REPO = Path(__file__).resolve().parents[1]
PROMPT = "import os\n\ndef read_lines(path):\n"


def _sample(kind: str, samples: int, tokens: int) -> list[list[int]]:
    from serve.config import ExactLaneConfig

    lane = ExactLaneConfig()
    if kind == "fastmode":
        return _sample_fastmode(lane, samples, tokens)
    from vllm import LLM, SamplingParams

    kw = dict(model=str(TEST_FULL), dtype=lane.dtype, kv_cache_memory_bytes=lane.kv_cache_memory_bytes,
              gpu_memory_utilization=lane.gpu_memory_utilization, enforce_eager=True, seed=0,
              max_num_seqs=lane.max_num_seqs, block_size=lane.block_size)
    if kind == "speculative":
        kw["speculative_config"] = {"method": "draft_model", "model": str(TEST_FAST),
                                    "num_speculative_tokens": lane.num_speculative_tokens}
    llm = LLM(**kw)
    params = [SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True, seed=i) for i in range(samples)]
    return [list(o.outputs[0].token_ids) for o in llm.generate([PROMPT] * samples, params)]


def _sample_fastmode(lane, samples: int, tokens: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from sharding.sampling import SamplingParams
    from sharding.speculative import SpeculativeEngine

    engine = SpeculativeEngine.from_pretrained(TEST_FULL, TEST_FAST, num_slots=lane.max_num_seqs, k=lane.num_speculative_tokens,
                                               adaptive=False)
    prompt = AutoTokenizer.from_pretrained(TEST_FULL)(PROMPT).input_ids  # as _score and vLLM tokenize it
    params = [SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True, seed=i) for i in range(samples)]
    return engine.generate([prompt] * samples, params)


def _score(outputs: list[list[int]]) -> dict:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    prompt = AutoTokenizer.from_pretrained(TEST_FULL)(PROMPT).input_ids
    model = LlamaForCausalLM.from_pretrained(TEST_FULL, dtype=torch.float32).eval()
    per_sample = []
    with torch.no_grad():
        for out in outputs:
            ids = prompt + out
            logp = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
            picked = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])][len(prompt) - 1:]
            per_sample.append(picked.mean().item())
    mean = statistics.mean(per_sample)
    half = 1.96 * statistics.stdev(per_sample) / math.sqrt(len(per_sample))
    return {"mean_logprob_per_token": mean, "ci95": [mean - half, mean + half], "samples": len(per_sample)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.speculative_sampling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--kinds", default="plain,speculative,fastmode", help="samplers, comma-separated: plain "
                    "(vLLM), speculative (vLLM draft_model), fastmode (sharding.speculative); plain comes first")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(_sample(args.worker, args.samples, args.tokens)))
        return 0
    started, results = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), {}
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    for kind in args.kinds.split(","):
        proc = subprocess.run([sys.executable, "-m", "bench.speculative_sampling", "--worker", kind, "--samples",
                               str(args.samples), "--tokens", str(args.tokens)],
                              capture_output=True, text=True, cwd=REPO, env=env, timeout=1200)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise SystemExit(f"{kind}: {proc.stderr[-2000:]}")
        results[kind] = _score(json.loads(lines[-1][7:]))
        r = results[kind]
        if kind != "plain" and "plain" in results:  # the difference and its 95% interval (Welch)
            p = results["plain"]
            d = r["mean_logprob_per_token"] - p["mean_logprob_per_token"]
            half = math.hypot(r["ci95"][1] - r["mean_logprob_per_token"], p["ci95"][1] - p["mean_logprob_per_token"])
            r["minus_plain"], r["minus_plain_ci95"] = d, [d - half, d + half]
        print(f"{kind:<12} mean log-prob per sampled token under the full model {r['mean_logprob_per_token']:.3f} "
              f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] ({r['samples']} samples)"
              + (f"; minus plain {r['minus_plain']:+.3f} [{r['minus_plain_ci95'][0]:+.3f}, "
                 f"{r['minus_plain_ci95'][1]:+.3f}]" if "minus_plain" in r else ""))
    if args.json:
        args.json.write_text(json.dumps({"command": "python -m bench.speculative_sampling " + " ".join(
            argv if argv is not None else sys.argv[1:]), "date": started, "prompt": PROMPT, "temperature": 1.0,
            "tokens": args.tokens, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
