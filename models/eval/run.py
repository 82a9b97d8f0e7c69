"""``fastmode eval``: the quality of the shipped pair (or any checkpoints) on the held-out files.

Metrics, each from text alone (so later issues run the same eval through the serving lanes):
- bits per byte of the held-out files;
- next-line exact match: greedy-decode the line after a prefix that ends at a newline, compare
  with the true line, character for character (indentation included);
- greedy agreement of the first model with the second (share of identical predicted lines);
- the trivial baseline "repeat the previous line" on the same samples.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from models import FAST, FULL
from models.recipe import corpus

from .backend import Backend, TransformersBackend, bits_per_byte
from .samples import LineSample, bpb_chunks, line_samples


@dataclass
class ModelScore:
    """One backend's scores."""

    name: str
    bits_per_byte: float | None
    exact_match: float
    exact_match_count: int
    samples: int
    seconds: float


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def score(backend: Backend, samples: list[LineSample], chunks: list[str], max_tokens: int,
          with_bpb: bool = True) -> tuple[ModelScore, list[str]]:
    """Exact match (and bits per byte) of one backend; also returns its predicted lines."""
    started = time.perf_counter()
    preds = [first_line(t) for t in backend.complete([s.prefix for s in samples], max_tokens)]
    hits = sum(p == s.target for p, s in zip(preds, samples))
    bpb = bits_per_byte(backend.nll(chunks), chunks) if with_bpb else None
    return ModelScore(backend.name, bpb, hits / len(samples), hits, len(samples),
                      time.perf_counter() - started), preds


def baseline(samples: list[LineSample]) -> ModelScore:
    hits = sum(s.previous_line == s.target for s in samples)
    return ModelScore("repeat previous line", None, hits / len(samples), hits, len(samples), 0.0)


def token_budget(tokenizer_dir: Path, budget: int):
    """A ``fits(text)`` test: at most ``budget`` tokens (``<|bos|>`` included) by this tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return lambda text: len(tok.encode(text).ids) <= budget


def evaluate(backends: list[Backend], n_samples: int, seed: int, max_tokens: int,
             max_files: int | None = None, with_bpb: bool = True, max_prefix_chars: int = 1000,
             max_chunk_chars: int = 1000, tokenizer_dir: Path | None = None, context: int | None = None) -> dict:
    """Score every backend on the same samples; agreement is of the first backend with each other.

    With ``tokenizer_dir`` and ``context``, prefixes are cut to fit ``context - max_tokens`` tokens
    and bits-per-byte chunks to fit ``context``, so every engine can take them whole."""
    _, held = corpus.split(corpus.list_files())
    if max_files is not None:
        held = held[:max_files]
    prefix_budget, chunk_budget = {}, {}
    if tokenizer_dir is not None and context is not None:
        prefix_budget = {"fits": token_budget(tokenizer_dir, context - max_tokens)}
        chunk_budget = {"fits": token_budget(tokenizer_dir, context)}
    samples = line_samples(held, n_samples, seed=seed, max_prefix_chars=max_prefix_chars, **prefix_budget)
    chunks = bpb_chunks(held, max_chunk_chars=max_chunk_chars, **chunk_budget)
    scores, preds = [], []
    for b in backends:
        s, p = score(b, samples, chunks, max_tokens, with_bpb)
        scores.append(s)
        preds.append(p)
    agreement = {
        f"{backends[i].name} vs {backends[0].name}":
            sum(a == b for a, b in zip(preds[0], preds[i])) / len(samples)
        for i in range(1, len(backends))
    }
    return {
        "held_out_files": len(held),
        "held_out_bytes": sum(len(f.text.encode("utf-8")) for f in held),
        "samples": n_samples,
        "seed": seed,
        "max_tokens": max_tokens,
        "max_prefix_chars": max_prefix_chars,
        "max_chunk_chars": max_chunk_chars,
        "models": [asdict(s) for s in scores],
        "baseline": asdict(baseline(samples)),
        "agreement": agreement,
        "examples": [
            {"file": s.file, "line": s.line_no, "target": s.target,
             **{backends[i].name: preds[i][k] for i in range(len(backends))}}
            for k, s in enumerate(samples[:5])
        ],
    }


def table(result: dict) -> str:
    """The result as a Markdown table."""
    rows = ["| model | bits per byte | next-line exact match | agreement with first |",
            "|---|---|---|---|"]
    agree = list(result["agreement"].values())
    for i, m in enumerate(result["models"]):
        bpb = f"{m['bits_per_byte']:.3f}" if m["bits_per_byte"] is not None else "-"
        ag = "-" if i == 0 else f"{agree[i - 1]:.1%}"
        rows.append(f"| {m['name']} | {bpb} | {m['exact_match']:.1%} ({m['exact_match_count']}/{m['samples']}) | {ag} |")
    b = result["baseline"]
    rows.append(f"| {b['name']} (baseline) | - | {b['exact_match']:.1%} ({b['exact_match_count']}/{b['samples']}) | - |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fastmode eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", type=Path,
                   help="checkpoint directory (repeatable; default: the shipped full, then fast)")
    p.add_argument("--samples", type=int, default=320, help="next-line samples (default 320)")
    p.add_argument("--seed", type=int, default=0, help="sample draw seed (default 0)")
    p.add_argument("--max-tokens", type=int, default=48, help="longest generated line, in tokens")
    p.add_argument("--max-files", type=int, default=None, help="use only the first N held-out files")
    p.add_argument("--max-prefix-chars", type=int, default=1000,
                   help="prefix budget, cut at whole lines (default 1000, fits a 512-token context)")
    p.add_argument("--max-chunk-chars", type=int, default=1000,
                   help="bits-per-byte chunk size, cut at lines (default 1000)")
    p.add_argument("--no-bpb", action="store_true", help="skip bits per byte")
    p.add_argument("--json", type=Path, help="also write the full result here")
    args = p.parse_args(argv)
    paths = args.model or [FULL, FAST]
    for path in paths:
        if not (path / "config.json").exists():
            p.error(f"{path} is not a checkpoint directory (no config.json)")
    backends = [TransformersBackend(path) for path in paths]
    context = min(json.loads((path / "config.json").read_text())["max_position_embeddings"] for path in paths)
    result = evaluate(backends, args.samples, args.seed, args.max_tokens, args.max_files, not args.no_bpb,
                      args.max_prefix_chars, args.max_chunk_chars, tokenizer_dir=paths[0], context=context)
    result["engine"] = "transformers (fp32)"
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
