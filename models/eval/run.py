"""``fastmode eval``: the quality of the shipped pair (or any checkpoints).

Two suites (``--suite``): ``v2`` (``models.eval.suite``: HumanEval executed in a sandbox, next-line
exact match, generated instruction tasks through the chat template; the default for a model with
a chat template) and ``next-line``, the test pair's eval described below (the default for a model
without one).

``next-line`` metrics, each from text alone (so the same eval runs through the serving lanes too):
- bits per byte of the held-out files;
- next-line exact match: greedy-decode the line after a prefix that ends at a newline, compare
  with the true line, character for character (indentation included);
- greedy agreement of the first model with the second (share of identical predicted lines);
- the trivial baseline "repeat the previous line" on the same samples.

Every exact match comes with its Wilson 95% interval, and every model after the first with a
paired comparison against the first on the same samples (``models.eval.stats``): the interval of
the difference and an exact McNemar p-value, which say whether a gap is more than chance.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from models.recipe import corpus

from . import suite
from .backend import Backend, TransformersBackend, bits_per_byte
from .samples import LineSample, bpb_chunks, line_samples
from .stats import compare, diff_text, pct_ci, wilson


@dataclass
class ModelScore:
    """One backend's scores."""

    name: str
    bits_per_byte: float | None
    exact_match: float
    exact_match_count: int
    samples: int
    seconds: float
    exact_match_ci95: tuple[float, float] = field(init=False)
    """Wilson score 95% interval of ``exact_match`` (from the count and ``samples``)."""

    def __post_init__(self) -> None:
        self.exact_match_ci95 = wilson(self.exact_match_count, self.samples)


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
             max_chunk_chars: int = 1000, tokenizer_dir: Path | None = None, context: int | None = None,
             per_sample: bool = False) -> dict:
    """Score every backend on the same samples; agreement and the paired comparison
    (``paired_with_first``: ``models.eval.stats.compare``) are of each other backend against the first.

    With ``tokenizer_dir`` and ``context``, prefixes are cut to fit ``context - max_tokens`` tokens
    and bits-per-byte chunks to fit ``context``, so every engine can take them whole. With
    ``per_sample``, the result also has ``per_sample``: per sample, its file, line, prefix, target,
    and each backend's predicted line and hit (large: for callers that analyse it, not for JSON)."""
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
    hits = [[p == s.target for p, s in zip(pr, samples)] for pr in preds]
    paired = {f"{backends[i].name} vs {backends[0].name}": compare(hits[i], hits[0])
              for i in range(1, len(backends))}
    result = {
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
        "paired_with_first": paired,
        "examples": [
            {"file": s.file, "line": s.line_no, "target": s.target,
             **{backends[i].name: preds[i][k] for i in range(len(backends))}}
            for k, s in enumerate(samples[:5])
        ],
    }
    if per_sample:
        result["per_sample"] = [
            {"file": s.file, "line": s.line_no, "prefix": s.prefix, "target": s.target,
             "predictions": {b.name: preds[i][k] for i, b in enumerate(backends)},
             "hits": {b.name: hits[i][k] for i, b in enumerate(backends)}}
            for k, s in enumerate(samples)
        ]
    return result


def table(result: dict) -> str:
    """The result as a Markdown table: exact match with its Wilson 95% interval, and each model
    after the first against the first (difference in points, paired bootstrap 95% interval, exact
    McNemar p)."""
    rows = ["| model | bits per byte | next-line exact match [95% CI] | agreement with first "
            "| exact match vs first [95% CI], McNemar p |", "|---|---|---|---|---|"]
    agree = list(result["agreement"].values())
    paired = list(result.get("paired_with_first", {}).values())
    for i, m in enumerate(result["models"]):
        bpb = f"{m['bits_per_byte']:.3f}" if m["bits_per_byte"] is not None else "-"
        ag = "-" if i == 0 else f"{agree[i - 1]:.1%}"
        vs = diff_text(paired[i - 1]) if i and paired else "-"
        em = f"{pct_ci(m['exact_match_count'], m['samples'])} ({m['exact_match_count']}/{m['samples']})"
        rows.append(f"| {m['name']} | {bpb} | {em} | {ag} | {vs} |")
    b = result["baseline"]
    em = f"{pct_ci(b['exact_match_count'], b['samples'])} ({b['exact_match_count']}/{b['samples']})"
    rows.append(f"| {b['name']} (baseline) | - | {em} | - | - |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fastmode eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", type=Path,
                   help="checkpoint directory, .gguf file, builtin:NAME or a student folder (distilled from the first "
                   "--model) (repeatable; default: the embedded default's full then fast model)")
    p.add_argument("--samples", type=int, default=1000,
                   help="next-line samples (default 1000: 50 hits then have a 95%% interval of 3.8-6.5%%)")
    p.add_argument("--seed", type=int, default=0, help="sample draw seed (default 0)")
    p.add_argument("--max-tokens", type=int, default=48, help="longest generated line, in tokens")
    p.add_argument("--max-files", type=int, default=None, help="use only the first N held-out files")
    p.add_argument("--max-prefix-chars", type=int, default=1000,
                   help="prefix budget, cut at whole lines (default 1000, fits a 512-token context)")
    p.add_argument("--max-chunk-chars", type=int, default=1000,
                   help="bits-per-byte chunk size, cut at lines (default 1000)")
    p.add_argument("--no-bpb", action="store_true", help="skip bits per byte")
    p.add_argument("--json", type=Path, help="also write the full result here")
    v2 = p.add_argument_group("suite v2")
    v2.add_argument("--suite", choices=("auto", "v2", "next-line"), default="auto",
                    help="v2 (HumanEval, next line, generated tasks) or next-line (bits per byte, next line); "
                         "auto: v2 when the first model has a chat template")
    v2.add_argument("--humaneval", type=int, default=suite.DEFAULT_COUNTS["humaneval"],
                    help="HumanEval problems, the first N (default all 164)")
    v2.add_argument("--next-line", type=int, default=suite.DEFAULT_COUNTS["next_line"],
                    help="next-line samples in v2 (default 400)")
    v2.add_argument("--tasks", type=int, default=suite.DEFAULT_COUNTS["tasks"],
                    help="generated instruction questions (default 450: 50 of each kind)")
    v2.add_argument("--batch-size", type=int, default=16, help="transformers' generation batch")
    v2.add_argument("--vocab", type=int, action="append", default=[], metavar="N",
                    help="also evaluate each model after the first that has token counts with its output cut to "
                         "its N most frequent tokens and its end ids, as the fast lane's vocab: N serves it "
                         "(repeatable); each request may also produce its own prompt's tokens, as the lane's "
                         "vocab_keeps_prompt (default) does")
    v2.add_argument("--vocab-keeps-prompt", action=argparse.BooleanOptionalAction, default=True,
                    help="with --vocab: each request may also produce its prompt's tokens (the lane's default)")
    args = p.parse_args(argv)
    try:
        if args.model:
            paths = []
            for path in args.model:  # a distilled student is assembled with the first model
                paths.append(checkpoint(path, full=paths[0] if paths else None))
        else:  # the embedded default's pair
            from models.builtin import default_pair

            paths = list(default_pair())
    except ValueError as e:
        p.error(str(e))
    if args.suite == "v2" or (args.suite == "auto" and has_template(paths[0])):
        return main_v2(args, paths)
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


def checkpoint(path: Path, full: Path | None = None) -> Path:
    """A checkpoint directory for ``path``: a folder, a GGUF file (converted, cached), ``builtin:NAME``
    or a student folder of ``fastmode distill`` assembled with ``full`` (``models.builtin.resolve``)."""
    from models.builtin import resolve

    folder = resolve(path, full=full)
    if not (folder / "config.json").exists():
        raise ValueError(f"{path} is not a checkpoint directory (no config.json), a GGUF file or builtin:NAME")
    return folder


def cut_vocabularies(paths: list[Path], size: int) -> list[tuple[Path, list[int]]]:
    """``(path, kept ids)`` for each of ``paths`` with token counts: the ids a fast lane with
    ``vocab: size`` keeps (``sharding.draft_vocab.vocab_ids``)."""
    from sharding.config import ModelConfig
    from sharding.draft_vocab import TOKEN_COUNTS, vocab_ids

    out = []
    for path in paths:
        if (path / TOKEN_COUNTS).is_file():
            config = ModelConfig.from_pretrained(path)
            out.append((path, vocab_ids(size, path, config.vocab_size, config.eos_token_ids)))
    return out


def has_template(path: Path) -> bool:
    """Whether the checkpoint carries a chat template (as ``serve.chat.has_chat_template`` reads it)."""
    if (path / "chat_template.jinja").exists():
        return True
    config = path / "tokenizer_config.json"
    return config.exists() and bool(json.loads(config.read_text()).get("chat_template"))


def main_v2(args, paths: list[Path]) -> int:
    """``fastmode eval --suite v2``: every model on the same v2 items (``models.eval.suite``)."""
    context = min(json.loads((path / "config.json").read_text())["max_position_embeddings"] for path in paths)
    counts = {"humaneval": args.humaneval, "next_line": args.next_line, "tasks": args.tasks}
    try:
        items = suite.build(counts, seed=args.seed, held=suite.held_out_files(args.max_files),
                            fits=token_budget(paths[0], context - suite.NEXT_LINE_MAX_TOKENS),
                            max_prefix_chars=args.max_prefix_chars)
    except (suite.SuiteError, ValueError) as e:
        print(f"fastmode eval: {e}", file=sys.stderr)
        return 2
    backends = [TransformersBackend(path, batch_size=args.batch_size) for path in paths]
    for size in args.vocab:
        label = f"vocab {size}" + ("" if args.vocab_keeps_prompt else ", not the prompt's tokens")
        backends += [TransformersBackend(path, batch_size=args.batch_size, name=f"{path.name} ({label})",
                                         keep=keep, keep_prompt=args.vocab_keeps_prompt)
                     for path, keep in cut_vocabularies(paths[1:], size)]
    names = [b.name for b in backends]
    for i, b in enumerate(backends):  # two checkpoints of one name (model.safetensors dirs) stay apart
        if names.count(b.name) > 1:
            b.name = f"{b.name}#{i}"
    result = suite.evaluate(backends, items)
    result.update(engine="transformers (fp32)", seed=args.seed, models_paths=[str(p) for p in paths])
    print(suite.table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
