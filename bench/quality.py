"""Quality against speed, per lane and for ``auto``: the Pareto report the seeds never published.

Every lane answers the held-out next-line questions of the quality eval (``models.eval``) through
the running application's WebSocket with the SDK, greedy, stopping at the end of the line; next-line
exact match is scored on what the lane returned, and speed on the same requests (per-user decode
tokens/s and mean latency, from each response's own timing, two streams at a time: the priority
lane's batch cap). Bits per byte need the likelihood of whole texts, which the lanes do not serve:
each lane's figure is that of the weights it serves (standard and priority: the full checkpoint;
fast: the fast one; ``auto``: per text, the model the router's difficulty rule picks), computed
with transformers, which vLLM and our executor match token for token (tests/models, tests/serve).

Usage: fastmode bench quality [--url ws://127.0.0.1:8000] [--api-key K] [--samples 320]
                              [--quick] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

from models import FAST, FULL
from models.eval.backend import TransformersBackend
from models.eval.run import evaluate

LANES = {"standard": ("fastmode-full", "default"), "priority": ("fastmode-full", "priority"),
         "fast": ("fastmode-fast", None), "auto": ("auto", None)}


class CachedNLL:
    """One checkpoint's text likelihoods (transformers), computed once per text."""

    def __init__(self, path: Path) -> None:
        self.path, self._backend, self._cache = path, None, {}

    def __call__(self, texts: list[str]) -> list[float]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            if self._backend is None:
                self._backend = TransformersBackend(self.path)
            self._cache.update(zip(missing, self._backend.nll(missing), strict=True))
        return [self._cache[t] for t in texts]


class ServedLane:
    """A ``models.eval`` backend whose completions come from a lane of the running application."""

    def __init__(self, name: str, url: str, api_key: str | None, nll, concurrency: int = 2) -> None:
        self.name, self.url, self.api_key, self._nll, self.concurrency = name, url, api_key, nll, concurrency
        self.model, self.tier = LANES[name]
        self.responses: list = []

    def complete(self, prompts: list[str], max_tokens: int) -> list[str]:
        return asyncio.run(self._complete(prompts, max_tokens))

    async def _complete(self, prompts: list[str], max_tokens: int) -> list[str]:
        from clients.sdk import AsyncClient

        out: list[str | None] = [None] * len(prompts)
        gate = asyncio.Semaphore(self.concurrency)
        bar = tqdm(total=len(prompts), desc=f"{self.name:<8}", unit="q", leave=False, file=sys.stderr)
        async with AsyncClient(self.url, api_key=self.api_key) as client:
            async def one(i: int, prompt: str) -> None:
                async with gate:
                    r = await client.responses.create(model=self.model, service_tier=self.tier, input=prompt,
                                                      max_output_tokens=max_tokens, temperature=0, stop=["\n"])
                self.responses.append(r)
                out[i] = r.text
                bar.update()

            await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        bar.close()
        return out

    def nll(self, texts: list[str]) -> list[float]:
        return self._nll(texts)

    def speed(self) -> dict:
        rates = [r.timing.decode_tokens_per_s for r in self.responses if r.timing.decode_tokens_per_s]
        lat = [r.timing.total_s for r in self.responses]
        lanes = [r.lane for r in self.responses]
        return {"per_user_tokens_per_s_p50": statistics.median(rates) if rates else None,
                "mean_latency_s": statistics.fmean(lat), "requests": len(lat),
                "served_by": {lane: lanes.count(lane) / len(lanes) for lane in sorted(set(lanes))}}


def auto_nll(full: CachedNLL, fast: CachedNLL, threshold: float, max_tokens: int):
    """Per text, the likelihood under the model the router's difficulty rule would pick."""
    from serve.difficulty import DifficultyScorer

    scorer = DifficultyScorer(FAST, max_tokens)

    def nll(texts: list[str]) -> list[float]:
        f, s = full(texts), fast(texts)
        return [s[i] if scorer.score(t) <= threshold else f[i] for i, t in enumerate(texts)]

    return nll


def pareto(points: dict[str, tuple[float, float]]) -> list[str]:
    """The names on the frontier: no other point is at least as fast and as good, and better in one."""
    front = []
    for n, (x, y) in points.items():
        if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for m, (x2, y2) in points.items() if m != n):
            front.append(n)
    return sorted(front, key=lambda n: points[n][0])


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = {n: (v["per_user_tokens_per_s_p50"], v["exact_match"]) for n, v in result["lanes"].items()}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, (x, y) in pts.items():
        ax.scatter([x], [y], s=60)
        bpb = result["lanes"][n]["bits_per_byte"]
        ax.annotate(f"{n}\n{y:.1%} EM, {bpb:.3f} bpb" if bpb else n, (x, y), textcoords="offset points",
                    xytext=(6, 6), fontsize=8)
    front = result["pareto_frontier"]
    ax.plot([pts[n][0] for n in front], [pts[n][1] for n in front], "--", color="gray", label="Pareto frontier")
    ax.set_xlabel("per-user decode tokens/s (p50)")
    ax.set_ylabel("next-line exact match")
    ax.set_title(f"quality against speed ({result['samples']} held-out prompts, {result['date']})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fastmode bench quality", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="ws://127.0.0.1:8000")
    ap.add_argument("--api-key", default=os.environ.get("FASTMODE_API_KEY"))
    ap.add_argument("--samples", type=int, default=320)
    ap.add_argument("--max-files", type=int, help="held-out files for bits per byte (default: all)")
    ap.add_argument("--auto-threshold", type=float, default=2.7, help="the deployed router.auto_threshold")
    ap.add_argument("--quick", action="store_true", help="16 prompts, 2 files: a smoke run")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    if args.quick:
        args.samples, args.max_files = 16, 2
    started = time.time()
    full, fast = CachedNLL(FULL), CachedNLL(FAST)
    nll = {"standard": full, "priority": full, "fast": fast, "auto": auto_nll(full, fast, args.auto_threshold, 128)}
    lanes = [ServedLane(n, args.url, args.api_key, nll[n]) for n in LANES]
    result = evaluate(lanes, n_samples=args.samples, seed=0, max_tokens=40, max_files=args.max_files,
                      tokenizer_dir=FULL, context=512)
    scores = {m["name"]: m for m in result["models"]}
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
           "command": "fastmode bench quality " + " ".join(sys.argv[1:] if argv is None else argv),
           "samples": args.samples, "held_out_files": result["held_out_files"], "seconds": time.time() - started,
           "lanes": {}, "baseline_exact_match": result["baseline"]["exact_match"],
           "agreement_with_standard": result["agreement"]}
    for lane in lanes:
        s = scores[lane.name]
        out["lanes"][lane.name] = {"exact_match": s["exact_match"], "exact_match_count": s["exact_match_count"],
                                   "bits_per_byte": s["bits_per_byte"], **lane.speed()}
    pts = {n: (v["per_user_tokens_per_s_p50"], v["exact_match"]) for n, v in out["lanes"].items()}
    out["pareto_frontier"] = pareto(pts)
    std = out["lanes"]["standard"]["exact_match"]
    out["fast_quality_retention"] = out["lanes"]["fast"]["exact_match"] / std if std else None
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "quality.json").write_text(json.dumps(out, indent=2))
    plot(out, outdir / "quality.png")
    print(f"{'lane':<9}{'exact match':>13}{'bits/byte':>11}{'tok/s p50':>11}{'latency':>10}")
    for n, v in out["lanes"].items():
        print(f"{n:<9}{v['exact_match']:>12.1%}{v['bits_per_byte']:>11.3f}{v['per_user_tokens_per_s_p50'] or 0:>11.0f}"
              f"{v['mean_latency_s'] * 1e3:>8.0f}ms")
    retention = out["fast_quality_retention"]
    print(f"Pareto frontier: {', '.join(out['pareto_frontier'])}; fast keeps "
          f"{'-' if retention is None else f'{retention:.0%}'} of standard's exact match; "
          f"auto served {out['lanes']['auto']['served_by']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
