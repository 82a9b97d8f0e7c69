"""Quality against speed, per lane and for ``auto``: what each lane's speed costs in quality.

Every lane answers the held-out next-line questions of the quality eval (``models.eval``, 1,000 by
default) through the running application's WebSocket with the SDK, greedy, stopping at the end of
the line; next-line exact match is scored on what the lane returned, with its Wilson 95% interval,
and every lane is compared with standard on the same samples (paired bootstrap interval of the
difference, exact McNemar p: ``models.eval.stats``). Speed comes from the same requests (per-user
decode tokens/s and mean latency, from each response's own timing, two streams at a time: the
priority lane's batch cap). A lane the server refuses (an older server without the ``exact`` tier,
a lane that is not deployed) is skipped with a message, except standard, the reference.

Bits per byte need the likelihood of whole texts, which the lanes do not serve: each lane's figure
is that of the weights it serves (standard, priority and exact: the full checkpoint, exact being
the full model's own greedy output; fast: the fast one; ``auto``: per text, the model the router's
difficulty rule picks), computed with transformers, which vLLM and our executor match token for
token (tests/models, tests/serve).

Per sample, every lane's hit and latency (``timing.total_s``) and the prompt's difficulty under the
router's own scorer (timed) go to ``quality_samples.jsonl``; from them ``bench.auto_policy``
replays threshold policies for ``auto`` and recommends one.

With ``--suite v2`` (the default when the full model has a chat template) every lane answers the
v2 eval instead (``models.eval.suite``: HumanEval run in a sandbox, next lines, generated chat
questions; ``measure_v2``): per lane the pooled score and each task set's with Wilson intervals,
the paired comparison with standard, agreement with standard's outputs; the per-sample records
keep the same fields for ``bench.auto_policy`` (``hit``, ``latency_s``, ``difficulty``), and the
lane fields ``exact_match*`` are then the pooled v2 score.

Usage: fastmode bench quality [--url ws://127.0.0.1:8000] [--api-key K] [--samples 1000]
                              [--suite auto|v2|next-line] [--quick] [--out bench/results] [--journal DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from bench.auto_policy import Sample, analyse, pareto, summary
from bench import pair
from models.eval import suite
from models.eval.backend import Request, TransformersBackend, cut_at_stop
from models.eval.run import evaluate, has_template
from models.eval.stats import diff_text, pct_ci
from serve.config import RouterConfig

STOP_LIMIT = 4
"""Stop strings a request may carry (OpenAI's limit, which every front door enforces: serve.request)."""

LANES = {"standard": ("fastmode-full", "default"), "priority": ("fastmode-full", "priority"),
         "exact": ("fastmode-full", "exact"), "fast": ("fastmode-fast", None), "auto": ("auto", None)}
"""Lane name -> (model, service_tier) of its requests; standard first: everything is compared with it."""
REFERENCE = "standard"
SAMPLES_FILE = "quality_samples.jsonl"
PROBE_PROMPT = "def main():\n"


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


class Journal:
    """The responses each lane has given so far, on disk, so that a run cut short (a sitting of
    ``make bench`` ending mid-stage) goes on where it stopped instead of from the start: one file
    per lane (``quality-journal-LANE.jsonl`` in ``folder``), a line per response as it arrives,
    keyed by its index and a hash of the whole request. A line whose request is not the one now at
    its index (another eval, other settings) or that was cut off mid-write is dropped on loading.
    ``fastmode bench all`` keeps the journal beside its results for ``--resume`` (which resumes only
    the same measured code on a machine of the same speed: ``bench.suite``) and removes it when a
    run starts over; ``bench quality`` removes it once its results are written."""

    PREFIX = "quality-journal-"

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def path(self, lane: str) -> Path:
        return self.folder / f"{self.PREFIX}{lane}.jsonl"

    @staticmethod
    def key(call: dict) -> str:
        return hashlib.sha256(json.dumps(call, sort_keys=True).encode()).hexdigest()

    def load(self, lane: str, calls: list[dict]) -> list:
        """Per call, the journal's response to it, or ``None``; the file is rewritten with only those."""
        from clients.sdk.client import Response, Timing

        out: list = [None] * len(calls)
        kept = []
        path = self.path(lane)
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                e = json.loads(line)
                i = e["i"]
                if 0 <= i < len(calls) and e["key"] == self.key(calls[i]) and out[i] is None:
                    r = e["response"]
                    out[i] = Response(id=r["id"], text=r["text"], lane=r["lane"], route=r["route"],
                                      timing=Timing(**r["timing"]))
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue  # a line cut off mid-write, or of another version
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in kept))
        return out

    def add(self, lane: str, i: int, call: dict, r) -> None:
        t = r.timing
        entry = {"i": i, "key": self.key(call), "response": {
            "id": getattr(r, "id", ""), "text": r.text, "lane": r.lane, "route": r.route,
            "timing": {"total_s": t.total_s, "decode_tokens_per_s": t.decode_tokens_per_s}}}
        with self.path(lane).open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def remove(self) -> None:
        for path in self.folder.glob(f"{self.PREFIX}*.jsonl"):
            path.unlink()


class ServedLane:
    """A ``models.eval`` backend whose completions come from a lane of the running application.

    ``connect()`` returns an async context manager yielding a client with the SDK's
    ``responses.create`` (default: ``clients.sdk.AsyncClient(url, api_key=api_key)``; tests pass a
    fake). After ``complete`` or ``generate``, ``responses[i]`` is the response to prompt ``i``. With
    a ``journal`` the lane's responses outlive a run cut short (``Journal``)."""

    def __init__(self, name: str, url: str, api_key: str | None, nll: Callable[[list[str]], list[float]],
                 concurrency: int = 2, connect: Callable | None = None, journal: Journal | None = None) -> None:
        self.name, self._nll, self.concurrency, self.journal = name, nll, concurrency, journal
        self.model, self.tier = LANES[name]
        self.connect = connect or (lambda: _sdk_client(url, api_key))
        self.responses: list = []

    async def probe(self) -> str | None:
        """``None`` if the lane answers one short request on its own lane; else why to skip it (the
        server's error, e.g. ``unknown_service_tier`` from a server without the ``exact`` tier)."""
        from clients.sdk.errors import InvalidRequest, LaneUnavailable

        try:
            async with self.connect() as client:
                r = await client.responses.create(model=self.model, service_tier=self.tier, input=PROBE_PROMPT,
                                                  max_output_tokens=1, temperature=0)
        except (InvalidRequest, LaneUnavailable) as e:  # UnknownModel, UnknownServiceTier are InvalidRequests
            return f"the server refused model={self.model!r} service_tier={self.tier!r}: {e}"
        if self.name != "auto" and r.lane != self.name:
            return (f"model={self.model!r} service_tier={self.tier!r} was served on lane {r.lane!r}, "
                    f"not {self.name!r}")
        return None

    def complete(self, prompts: list[str], max_tokens: int) -> list[str]:
        calls = [{"input": p, "max_output_tokens": max_tokens, "stop": ["\n"]} for p in prompts]
        return [r.text for r in asyncio.run(self._run(calls))]

    def generate(self, requests: list[Request]) -> list[str]:
        """The v2 eval's requests (``models.eval.suite``) on this lane: text or chat messages as
        ``input``, greedy, the request's stop strings; the text cut at them as every engine's is."""
        # the server takes at most STOP_LIMIT stop strings; greedy, stopping at fewer of them only
        # lengthens the text, which is then cut at all of them
        calls = [{"input": r.prompt if isinstance(r.prompt, str) else list(r.prompt), "max_output_tokens": r.max_tokens,
                  **({"stop": list(r.stop)[:STOP_LIMIT]} if r.stop else {})} for r in requests]
        responses = asyncio.run(self._run(calls))
        return [cut_at_stop(r.text, req.stop) for r, req in zip(responses, requests)]

    async def _run(self, calls: list[dict]) -> list:
        """``responses.create`` once per call (greedy, on this lane), ``concurrency`` at a time; the
        responses in the calls' order, also in ``self.responses``. With a journal, a call it holds
        is not sent again, and each new response is added to it as it arrives."""
        calls = [{"model": self.model, "service_tier": self.tier, "temperature": 0, **c} for c in calls]
        responses: list = self.journal.load(self.name, calls) if self.journal else [None] * len(calls)
        todo = [i for i, r in enumerate(responses) if r is None]
        if len(todo) < len(calls):
            print(f"quality: the {self.name} lane's journal holds {len(calls) - len(todo)} of its {len(calls)} "
                  "responses (a run cut short); sending the rest", file=sys.stderr)
        gate = asyncio.Semaphore(self.concurrency)
        bar = tqdm(total=len(calls), initial=len(calls) - len(todo), desc=f"{self.name:<8}", unit="q", leave=False,
                   file=sys.stderr)
        async with self.connect() as client:
            async def one(i: int) -> None:
                async with gate:
                    responses[i] = await client.responses.create(**calls[i])
                if self.journal:
                    self.journal.add(self.name, i, calls[i], responses[i])
                bar.update()

            await asyncio.gather(*(one(i) for i in todo))
        bar.close()
        self.responses = responses
        return responses

    def nll(self, texts: list[str]) -> list[float]:
        return self._nll(texts)

    def threshold(self) -> float | None:
        """The deployed ``router.auto_threshold``, as an ``auto`` response's route reports it."""
        return next((r.route["threshold"] for r in self.responses if r.route and "threshold" in r.route), None)

    def fast_when(self) -> str:
        """The deployed ``router.auto_fast_when`` ("easy" from a server that does not report it)."""
        return next((r.route["fast_when"] for r in self.responses if r.route and r.route.get("fast_when")), "easy")

    def speed(self) -> dict:
        rates = [r.timing.decode_tokens_per_s for r in self.responses if r.timing.decode_tokens_per_s]
        lat = [r.timing.total_s for r in self.responses]
        lanes = [r.lane for r in self.responses]
        return {"per_user_tokens_per_s_p50": statistics.median(rates) if rates else None,
                "mean_latency_s": statistics.fmean(lat), "requests": len(lat),
                "served_by": {lane: lanes.count(lane) / len(lanes) for lane in sorted(set(lanes))}}


def _sdk_client(url: str, api_key: str | None):
    from clients.sdk import AsyncClient

    return AsyncClient(url, api_key=api_key)


def goes_fast(score: float, threshold: float, fast_when: str) -> bool:
    """Whether the router sends a prompt of this difficulty to the fast lane (``serve.router``)."""
    return score > threshold if fast_when == "hard" else score <= threshold


def auto_nll(full: CachedNLL, fast: CachedNLL, threshold: Callable[[], float], score: Callable[[str], float],
             fast_when: Callable[[], str] = lambda: "easy"):
    """Per text, the likelihood under the model the router's difficulty rule would pick."""

    def nll(texts: list[str]) -> list[float]:
        f, s, t, way = full(texts), fast(texts), threshold(), fast_when()
        return [s[i] if goes_fast(score(text), t, way) else f[i] for i, text in enumerate(texts)]

    return nll


def timed_scores(prompts: list[str], score: Callable[[str], float]) -> list[tuple[float, float]]:
    """(score, seconds) per prompt, after one warm-up call (the router's scorer is warm too)."""
    score(prompts[0])
    out = []
    for p in tqdm(prompts, desc="scoring", unit="q", leave=False, file=sys.stderr):
        t = time.perf_counter()
        out.append((score(p), time.perf_counter() - t))
    return out


def measure(lanes: list[ServedLane], score: Callable[[str], float], samples: int, max_files: int | None = None,
            max_tokens: int = 40, context: int = 512) -> tuple[dict, list[dict]]:
    """Probe, then run the eval through every lane that answers; returns (the quality.json fields
    of the lanes, the comparisons and the ``auto`` sweep; the per-sample records)."""
    skipped = dict(zip((lane.name for lane in lanes), asyncio.run(_probe_all(lanes))))
    skipped = {n: why for n, why in skipped.items() if why}
    for name, why in skipped.items():
        print(f"quality: skipping the {name} lane: {why}", file=sys.stderr)
    if REFERENCE in skipped or lanes[0].name != REFERENCE:
        raise ValueError(f"the {REFERENCE} lane must come first and answer: every lane is compared with it "
                         f"({skipped.get(REFERENCE, 'it is not first')})")
    lanes = [lane for lane in lanes if lane.name not in skipped]
    result = evaluate(lanes, n_samples=samples, seed=0, max_tokens=max_tokens, max_files=max_files,
                      tokenizer_dir=pair.full(), context=context, per_sample=True)
    per_sample = result.pop("per_sample")
    scores = {m["name"]: m for m in result["models"]}
    out = {"samples": samples, "held_out_files": result["held_out_files"], "lanes": {}, "skipped_lanes": skipped,
           "baseline_exact_match": result["baseline"]["exact_match"],
           "baseline_exact_match_ci95": list(result["baseline"]["exact_match_ci95"]),
           "agreement_with_standard": result["agreement"]}
    for lane in lanes:
        s = scores[lane.name]
        out["lanes"][lane.name] = {"exact_match": s["exact_match"], "exact_match_count": s["exact_match_count"],
                                   "exact_match_ci95": list(s["exact_match_ci95"]),
                                   "bits_per_byte": s["bits_per_byte"], **lane.speed()}
        if lane.name != REFERENCE:
            out["lanes"][lane.name]["vs_standard"] = result["paired_with_first"][f"{lane.name} vs {REFERENCE}"]
    pts = {n: (v["per_user_tokens_per_s_p50"] or 0.0, v["exact_match"]) for n, v in out["lanes"].items()}
    out["pareto_frontier"] = pareto(pts)
    std = out["lanes"][REFERENCE]["exact_match"]
    out["fast_quality_retention"] = (out["lanes"]["fast"]["exact_match"] / std
                                     if std and "fast" in out["lanes"] else None)

    timed = timed_scores([s["prefix"] for s in per_sample], score)
    records = sample_records(lanes, per_sample, timed)
    _auto_and_scoring(out, lanes, records, timed)
    return out, records


def sample_records(lanes: list[ServedLane], per_sample: list[dict], timed: list[tuple[float, float]]) -> list[dict]:
    """One ``quality_samples.jsonl`` record per sample: ``i``, ``file``, ``line``, ``target``,
    ``difficulty`` and ``scoring_s`` (the router's scorer, offline), and per lane ``hit``,
    ``latency_s`` (``timing.total_s``) and ``text`` (the predicted line); for ``auto`` also
    ``served_by`` and ``route_difficulty`` (the lane the router chose and the score it reported)."""
    records = []
    for i, (s, (difficulty, secs)) in enumerate(zip(per_sample, timed, strict=True)):
        rec = {"i": i, "file": s["file"], "line": s["line"], "target": s["target"], "difficulty": difficulty,
               "scoring_s": secs, "lanes": {}}
        for lane in lanes:
            r = lane.responses[i]
            rec["lanes"][lane.name] = {"hit": s["hits"][lane.name], "latency_s": r.timing.total_s,
                                       "text": s["predictions"][lane.name]}
            if lane.name == "auto":
                rec["lanes"]["auto"].update(served_by=r.lane, route_difficulty=(r.route or {}).get("difficulty"))
        records.append(rec)
    return records


def measure_v2(lanes: list[ServedLane], score: Callable, counts: dict[str, int], max_files: int | None = None,
               context: int = 512, tokenizer_dir: Path | None = None, seed: int = 0) -> tuple[dict, list[dict]]:
    """``measure`` on the v2 eval: probe, run ``models.eval.suite`` through every lane that answers;
    returns (the quality.json fields, the per-sample records). ``score`` is the router's scorer; a
    chat item is scored as the router scores a conversation (``serve.request.ChatPrompt``)."""
    from serve.request import ChatPrompt

    skipped = dict(zip((lane.name for lane in lanes), asyncio.run(_probe_all(lanes))))
    skipped = {n: why for n, why in skipped.items() if why}
    for name, why in skipped.items():
        print(f"quality: skipping the {name} lane: {why}", file=sys.stderr)
    if REFERENCE in skipped or lanes[0].name != REFERENCE:
        raise ValueError(f"the {REFERENCE} lane must come first and answer: every lane is compared with it "
                         f"({skipped.get(REFERENCE, 'it is not first')})")
    lanes = [lane for lane in lanes if lane.name not in skipped]
    items = suite.build(counts, seed=seed, held=suite.held_out_files(max_files),
                        fits=suite.token_fits(tokenizer_dir or pair.full(), context - suite.NEXT_LINE_MAX_TOKENS))
    result = suite.evaluate(lanes, items, per_sample=True)
    per_sample = result.pop("per_sample")
    out = {"suite": "v2", "samples": len(items), "counts": result["counts"], "training_data": result["training_data"],
           "lanes": {}, "skipped_lanes": skipped, "baseline": result["baseline"],
           "baseline_exact_match": result["baseline"]["all"]["score"],
           "baseline_exact_match_ci95": result["baseline"]["all"]["ci95"],
           "agreement_with_standard": {k: v["all"] for k, v in result["agreement"].items()},
           "agreement_with_standard_by_task": {k: v["tasks"] for k, v in result["agreement"].items()}}
    for lane, m in zip(lanes, result["models"]):
        out["lanes"][lane.name] = {"exact_match": m["all"]["score"], "exact_match_count": m["all"]["hits"],
                                   "exact_match_ci95": m["all"]["ci95"], "tasks": m["tasks"], "kinds": m["kinds"],
                                   "bits_per_byte": None, **lane.speed()}
        if lane.name != REFERENCE:
            v = result["vs_first"][f"{lane.name} vs {REFERENCE}"]
            out["lanes"][lane.name].update(vs_standard=v["all"], vs_standard_by_task=v["tasks"])
    pts = {n: (v["per_user_tokens_per_s_p50"] or 0.0, v["exact_match"]) for n, v in out["lanes"].items()}
    out["pareto_frontier"] = pareto(pts)
    std = out["lanes"][REFERENCE]["exact_match"]
    out["fast_quality_retention"] = (out["lanes"]["fast"]["exact_match"] / std
                                     if std and "fast" in out["lanes"] else None)
    prompts = [it.request.prompt if isinstance(it.request.prompt, str)
               else ChatPrompt(tuple((m["role"], m["content"]) for m in it.request.prompt)) for it in items]
    timed = timed_scores(prompts, score)
    records = []
    for i, (s, it, (difficulty, secs)) in enumerate(zip(per_sample, items, timed, strict=True)):
        rec = {"i": i, "id": s["id"], "task": s["task"], "kind": s["kind"], "target": s["reference"],
               "difficulty": difficulty, "scoring_s": secs, "lanes": {}}
        for lane in lanes:
            r = lane.responses[i]
            rec["lanes"][lane.name] = {"hit": s["hits"][lane.name], "latency_s": r.timing.total_s,
                                       "text": s["outputs"][lane.name]}
            if lane.name == "auto":
                rec["lanes"]["auto"].update(served_by=r.lane, route_difficulty=(r.route or {}).get("difficulty"))
        records.append(rec)
    _auto_and_scoring(out, lanes, records, timed)
    return out, records


def _auto_and_scoring(out: dict, lanes: list[ServedLane], records: list[dict], timed: list[tuple[float, float]]) -> None:
    """The fields both evals add to ``out``: the scorer's cost, what the served ``auto`` did, and the
    replayed ``auto`` policies (``bench.auto_policy``)."""
    seconds = [secs for _, secs in timed]
    out["difficulty_scoring"] = {"mean_s": statistics.fmean(seconds), "p50_s": statistics.median(seconds),
                                 "max_s": max(seconds)}
    auto = next((lane for lane in lanes if lane.name == "auto"), None)
    served_threshold = auto.threshold() if auto else None
    if served_threshold is not None:
        way = auto.fast_when()
        agree = sum(goes_fast(r["difficulty"], served_threshold, way) == (r["lanes"]["auto"]["served_by"] == "fast")
                    for r in records)
        a = out["lanes"]["auto"]
        out["auto_served"] = {"threshold": served_threshold, "fast_when": way, "served_by": a["served_by"],
                              "mean_latency_s": a["mean_latency_s"], "exact_match": a["exact_match"],
                              "exact_match_count": a["exact_match_count"],
                              "exact_match_ci95": a["exact_match_ci95"],
                              "routing_agreement_with_offline_scorer": agree / len(records)}
    out.update(analyse([Sample.from_record(r) for r in records], served_threshold))


async def _probe_all(lanes: list[ServedLane]) -> list[str | None]:
    return [await lane.probe() for lane in lanes]


def plot(result: dict, path: Path) -> None:
    """Left: per-user speed against exact match per lane (Wilson 95% bars). Right: mean latency
    against exact match of every replayed ``auto`` policy, the lanes, and the frontier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for n, v in result["lanes"].items():
        x, y = v["per_user_tokens_per_s_p50"] or 0.0, v["exact_match"]
        lo, hi = v.get("exact_match_ci95") or (y, y)
        ax.errorbar([x], [y], yerr=[[max(0.0, y - lo)], [max(0.0, hi - y)]], fmt="o", capsize=3)
        bpb = v["bits_per_byte"]
        ax.annotate(f"{n}\n{y:.1%} EM, {bpb:.3f} bpb" if bpb else n, (x, y), textcoords="offset points",
                    xytext=(6, 6), fontsize=8)
    front = result["pareto_frontier"]
    ax.plot([result["lanes"][n]["per_user_tokens_per_s_p50"] or 0.0 for n in front],
            [result["lanes"][n]["exact_match"] for n in front], "--", color="gray", label="Pareto frontier")
    ax.set_xlabel("per-user decode tokens/s (p50)")
    ax.set_ylabel("next-line exact match (95% CI)")
    ax.set_title(f"quality against speed ({result['samples']} held-out prompts, {result['date']})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    for tier in sorted({p["full_tier"] for p in result.get("auto_policies", [])}):
        pol = [p for p in result["auto_policies"] if p["full_tier"] == tier]
        ax2.plot([1e3 * p["mean_latency_s"] for p in pol], [p["exact_match"] for p in pol], ".-", alpha=0.6,
                 label=f"fast if score <= t, else {tier}")
    for n, v in result["lanes"].items():  # each lane as measured (auto: the deployed router)
        ax2.scatter([1e3 * v["mean_latency_s"]], [v["exact_match"]], marker="s", color="black", s=20)
        ax2.annotate(n, (1e3 * v["mean_latency_s"], v["exact_match"]), textcoords="offset points",
                     xytext=(4, -10), fontsize=7)
    front2 = result.get("auto_policy_frontier", [])
    ax2.plot([1e3 * p["mean_latency_s"] for p in front2], [p["exact_match"] for p in front2], "--", color="gray",
             label="frontier")
    rec = result.get("auto_recommended")
    if rec:
        ax2.scatter([1e3 * rec["mean_latency_s"]], [rec["exact_match"]], marker="*", s=160, color="red", zorder=5,
                    label=f"recommended: {rec['name']}")
    ax2.set_xlabel("mean latency per request, ms (scoring included)")
    ax2.set_ylabel("next-line exact match")
    ax2.set_title("auto: threshold policies replayed on the measured samples", fontsize=10)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_summary(out: dict) -> None:
    print(f"{'lane':<9}{'exact match [95% CI]':>24}{'bits/byte':>11}{'tok/s p50':>11}{'latency':>10}  vs standard")
    for n, v in out["lanes"].items():
        vs = diff_text(v["vs_standard"]) if "vs_standard" in v else "-"
        bpb = "-" if v["bits_per_byte"] is None else f"{v['bits_per_byte']:.3f}"
        print(f"{n:<9}{pct_ci(v['exact_match_count'], out['samples']):>24}{bpb:>11}"
              f"{v['per_user_tokens_per_s_p50'] or 0:>11.0f}{v['mean_latency_s'] * 1e3:>8.0f}ms  {vs}")
    for n, why in out["skipped_lanes"].items():
        print(f"{n:<9}skipped: {why}")
    retention = out["fast_quality_retention"]
    print(f"Pareto frontier: {', '.join(out['pareto_frontier'])}; fast keeps "
          f"{'-' if retention is None else f'{retention:.0%}'} of standard's exact match; "
          f"auto served {out['lanes'].get('auto', {}).get('served_by')}")
    print("\n".join(summary(out)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fastmode bench quality", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="ws://127.0.0.1:8000")
    ap.add_argument("--api-key", default=os.environ.get("FASTMODE_API_KEY"))
    ap.add_argument("--samples", type=int, default=1000, help="held-out next-line prompts (default 1000)")
    ap.add_argument("--max-files", type=int, help="held-out files for bits per byte (default: all)")
    ap.add_argument("--auto-threshold", type=float, default=RouterConfig().auto_threshold,
                    help="router.auto_threshold when no auto response reports it (default: the router's "
                    "default; bits per byte of auto)")
    ap.add_argument("--auto-max-tokens", type=int, default=128, help="the deployed router.auto_max_tokens")
    ap.add_argument("--suite", choices=("auto", "v2", "next-line"), default="auto",
                    help="the eval the lanes answer (auto: v2 when the full model has a chat template)")
    ap.add_argument("--humaneval", type=int, default=suite.DEFAULT_COUNTS["humaneval"], help="v2: HumanEval problems")
    ap.add_argument("--next-line", type=int, default=suite.DEFAULT_COUNTS["next_line"], help="v2: next-line samples")
    ap.add_argument("--tasks", type=int, default=suite.DEFAULT_COUNTS["tasks"], help="v2: generated questions")
    ap.add_argument("--quick", action="store_true", help="16 prompts, 2 files: a smoke run")
    ap.add_argument("--lanes", default=",".join(LANES),
                    help=f"the lanes to measure, comma-separated (default all: {','.join(LANES)}; standard "
                         "always, every other is compared with it)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--journal", type=Path, help="keep every response in this folder as it arrives, and send "
                    "none it already holds (a run cut short goes on where it stopped; removed once the results "
                    "are written; Journal)")
    args = ap.parse_args(argv)
    chosen = [n.strip() for n in args.lanes.split(",") if n.strip()]
    if unknown := [n for n in chosen if n not in LANES]:
        ap.error(f"--lanes: unknown lane(s) {', '.join(unknown)} (lanes: {', '.join(LANES)})")
    if REFERENCE not in chosen:
        ap.error(f"--lanes must include {REFERENCE}: every lane is compared with it")
    if args.quick:
        args.samples, args.max_files = 16, 2
        args.humaneval, args.next_line, args.tasks = 2, 5, 9
    FULL, FAST = pair.models()  # what the app serves (bench.pair)
    v2 = args.suite == "v2" or (args.suite == "auto" and has_template(FULL))
    started = time.time()
    scorer = None

    def score(text: str) -> float:  # the router's own scorer, loaded on first use
        nonlocal scorer
        if scorer is None:
            from serve.difficulty import DifficultyScorer

            scorer = DifficultyScorer(FAST, args.auto_max_tokens)
        return scorer.score(text)

    def threshold() -> float:  # the served one once auto has answered, else the flag
        served = next((lane.threshold() for lane in lanes if lane.name == "auto"), None)
        return args.auto_threshold if served is None else served

    def fast_when() -> str:
        return next((lane.fast_when() for lane in lanes if lane.name == "auto"), "easy")

    full, fast = CachedNLL(FULL), CachedNLL(FAST)
    lanes: list[ServedLane] = []
    nll = {"standard": full, "priority": full, "exact": full, "fast": fast,
           "auto": auto_nll(full, fast, threshold, score, fast_when)}
    journal = Journal(args.journal) if args.journal else None
    lanes += [ServedLane(n, args.url, args.api_key, nll[n], journal=journal) for n in LANES if n in chosen]
    try:
        if v2:
            context = json.loads((FULL / "config.json").read_text())["max_position_embeddings"]
            measured, records = measure_v2(lanes, score, {"humaneval": args.humaneval, "next_line": args.next_line,
                                                          "tasks": args.tasks}, args.max_files, context)
        else:
            measured, records = measure(lanes, score, args.samples, args.max_files)
    except ValueError as e:
        print(f"fastmode bench quality: {e}", file=sys.stderr)
        return 2
    out = {"date": time.strftime("%Y-%m-%d %H:%M"),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
           "command": "fastmode bench quality " + " ".join(sys.argv[1:] if argv is None else argv),
           "seconds": time.time() - started, "per_sample_file": SAMPLES_FILE, **measured}
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "quality.json").write_text(json.dumps(out, indent=2))
    (outdir / SAMPLES_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    plot(out, outdir / "quality.png")
    if journal:
        journal.remove()
    print_summary(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
