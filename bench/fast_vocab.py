"""The fast lane's ring with its head cut to fewer tokens (``lanes.fast.vocab``), with more slots and
with other fast models, against the first configuration, in one run.

Each configuration (``--fast`` models, the pair's by default, times ``--vocab`` sizes, ``none`` the
whole vocabulary, times ``--slots`` counts) is the fast lane's ring as ``fastmode up`` builds it on
this machine (``bench.in_process.fast_ring``:
its layout and options, these two changed), warmed up, then timed: one stream's tokens/s over
``--tokens`` greedy tokens of the lanes benchmark's chat prompt (prefill included), and the
aggregate tokens/s of as many streams as the ring has slots. One ring is alive at a time (they
share the chips); ``--rounds`` rounds build each again, in alternating order (A B, B A, ...), so
that the machine's drift hits all alike. The medians over rounds are reported, each against the
first configuration's.

What a cut costs in quality is the eval's to say (``fastmode eval --vocab N``).

Usage: python -m bench.fast_vocab [--fast DIR,DIR] [--vocab none,4096,16384] [--slots 8,32]
       [--keep-prompt on,off] [--tokens 128] [--rounds 2] [--no-compile] [--json FILE]

``--fast`` takes checkpoint folders or student folders (``fastmode distill``'s, assembled with the
pair's full model, ``models.builtin.resolve``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench.rounds import round_order


def _prompt(tokenizer_dir: Path) -> list[int]:
    """The lanes benchmark's chat prompt (``bench.targets.CHAT_PROMPT``) as the lanes render it:
    through the chat template, tokenized without adding special tokens."""
    from transformers import AutoTokenizer

    from bench.targets import CHAT_PROMPT

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    if tok.chat_template:
        text = tok.apply_chat_template([{"role": "user", "content": CHAT_PROMPT}], add_generation_prompt=True,
                                       tokenize=False)
        return tok(text, add_special_tokens=False).input_ids
    return tok(CHAT_PROMPT).input_ids


def measure(vocab: int | None, slots: int, tokens: int, compile: bool = True, model: Path | None = None,
            keep_prompt: bool = True) -> dict:
    """One configuration's ring, built, warmed up and timed (see the module docstring); ``model``: a
    fast model other than the pair's; ``keep_prompt``: the lane's ``vocab_keeps_prompt``."""
    from bench import pair
    from bench.in_process import fast_ring
    from sharding.sampling import SamplingParams

    prompt = _prompt(model or pair.fast())
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    t0 = time.perf_counter()
    with fast_ring(compile, model=model, vocab=vocab, num_slots=slots, vocab_keeps_prompt=keep_prompt) as ring:
        start_s = time.perf_counter() - t0
        m = ring.model
        m.generate([prompt], params)  # the prompt's first run: its prefix is cached after, as on a lane
        t = time.perf_counter()
        m.generate([prompt], params)
        one = tokens / (time.perf_counter() - t)
        t = time.perf_counter()
        outs = m.generate([prompt] * slots, params)
        aggregate = sum(map(len, outs)) / (time.perf_counter() - t)
        head = "whole" if vocab is None else len(ring.options["vocab"])
    return {"model": str(model or pair.fast()), "vocab": vocab, "head_rows": head, "slots": slots, "start_s": start_s,
            "keeps_prompt": keep_prompt and vocab is not None,
            "one_stream_tokens_per_s": one, "aggregate_tokens_per_s": aggregate}


def _rows(res: dict) -> str:
    """A configuration's head: ``whole``, or its kept rows (``+prompt``: and each request's prompt tokens)."""
    return f"{res['head_rows']!s:>6}" + ("+prompt" if res["keeps_prompt"] else "")


def _name(model: Path | None) -> str:
    return "the pair's fast model" if model is None else Path(model).name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fast_vocab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", default="", help="fast models, comma-separated (default: the pair's)")
    ap.add_argument("--vocab", default="none,4096,16384", help="head sizes, comma-separated; none: the whole head")
    ap.add_argument("--slots", default="8", help="slot counts, comma-separated (each also the streams timed)")
    ap.add_argument("--keep-prompt", default="on", help="with a cut head, the lane's vocab_keeps_prompt: on, off "
                    "or on,off (both, side by side)")
    ap.add_argument("--tokens", type=int, default=128, help="output tokens per stream")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="as the lane runs (--no-compile: eager, for smoke runs)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    try:
        sizes = [None if v.strip() == "none" else int(v) for v in args.vocab.split(",")]
        slot_counts = [int(s) for s in args.slots.split(",")]
        keeps = [{"on": True, "off": False}[k.strip()] for k in args.keep_prompt.split(",")]
    except (ValueError, KeyError):
        ap.error("--vocab takes sizes or none, --slots counts, --keep-prompt on or off, comma-separated")
    from bench import pair
    from models.builtin import ModelPathError, resolve

    try:
        models = [resolve(m.strip(), full=pair.full()) for m in args.fast.split(",") if m.strip()] or [None]
    except ModelPathError as e:
        ap.error(str(e))
    configs = [(m, v, s, k) for m in models for s in slot_counts for v in sizes for k in (keeps if v else keeps[:1])]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs: dict[tuple, list[dict]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for m, v, s, k in round_order(configs, r):
            res = measure(v, s, args.tokens, args.compile, m, k)
            runs[(m, v, s, k)].append(res)
            print(f"round {r + 1}: {_name(m)}: vocab {_rows(res)} slots {s:>3}: one stream "
                  f"{res['one_stream_tokens_per_s']:7.1f} tok/s, {s} streams {res['aggregate_tokens_per_s']:7.1f} "
                  f"tok/s (ready in {res['start_s']:.0f} s)", flush=True)
    rows = []
    base = None
    for (m, v, s, _), rs in runs.items():
        row = {"model": rs[0]["model"], "vocab": v, "head_rows": rs[0]["head_rows"], "slots": s,
               "keeps_prompt": rs[0]["keeps_prompt"],
               "one_stream_tokens_per_s": statistics.median(x["one_stream_tokens_per_s"] for x in rs),
               "aggregate_tokens_per_s": statistics.median(x["aggregate_tokens_per_s"] for x in rs)}
        base = base or row
        row["one_stream_vs_first"] = row["one_stream_tokens_per_s"] / base["one_stream_tokens_per_s"]
        row["aggregate_vs_first"] = row["aggregate_tokens_per_s"] / base["aggregate_tokens_per_s"]
        rows.append(row)
        print(f"{_name(m)}: vocab {_rows(row)} slots {s:>3}: one stream {row['one_stream_tokens_per_s']:7.1f} "
              f"tok/s ({row['one_stream_vs_first']:.2f}x), aggregate {row['aggregate_tokens_per_s']:7.1f} "
              f"tok/s ({row['aggregate_vs_first']:.2f}x)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(
            {"benchmark": "fast lane: cut head and slots", "date": started,
             "command": "python -m bench.fast_vocab " + " ".join(sys.argv[1:] if argv is None else argv),
             "tokens": args.tokens, "rounds": args.rounds, "results": rows,
             "runs": [r for rs in runs.values() for r in rs]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
