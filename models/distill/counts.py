"""``python -m models.distill.counts STUDENT --full PATH``: a student's ``token_counts.json``, made again.

``fastmode distill`` writes ``token_counts.json`` beside the student it makes: the tokens of the full
model's answers it trained on, most frequent first (``sharding.draft_vocab``). For a student made
without it, this command answers the same prompts with the full model again (``distilled.json``'s
prompt count, seed, answer length and batch, so the greedy answers, and so the counts, are those the
run trained on) and writes the file into the student's folder. ``--prompts N`` counts the first
``N`` prompts only (fewer minutes, a rougher ranking).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def recount(student: Path, full: Path, *, prompts: int | None = None, threads: int = 1, log=print) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sharding.draft_vocab import count_tokens

    from . import teacher
    from .export import MANIFEST, write_token_counts
    from .prompts import prompt_set
    from .run import answer_ids

    settings = json.loads((student / MANIFEST).read_text())["settings"]
    torch.set_num_threads(threads)
    n = min(prompts or settings["prompts"], settings["prompts"])
    texts = prompt_set(settings["prompts"], settings["seed"], version=settings.get("prompt_set", 1))[:n]
    tokenizer = AutoTokenizer.from_pretrained(full)
    model = AutoModelForCausalLM.from_pretrained(full, dtype=torch.float32).eval()
    started, answers = time.perf_counter(), []
    batch = settings["gen_batch"]
    for start in range(0, len(texts), batch):
        rows = teacher.answer(model, tokenizer, texts[start:start + batch], max_new_tokens=settings["max_new_tokens"],
                              top_k=1)
        answers += answer_ids(rows)
        log(f"counts: {len(answers)}/{len(texts)} prompts answered ({time.perf_counter() - started:.0f} s)")
    counts = count_tokens(answers)
    path = write_token_counts(student, counts)
    log(f"counts: wrote {path}: {counts['tokens']} answer tokens, {len(counts['counts'])} distinct")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m models.distill.counts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("student", type=Path, help="the student folder (its distilled.json)")
    ap.add_argument("--full", required=True, help="its full model: a checkpoint folder, a GGUF file or builtin:NAME")
    ap.add_argument("--prompts", type=int, default=None, help="count only the first N of its prompts")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    args = ap.parse_args(argv)
    from models.builtin import ModelPathError, resolve

    from .assemble import is_student

    if not is_student(args.student):
        print(f"counts: {args.student} is not a student folder (no distilled.json and student.safetensors)",
              file=sys.stderr)
        return 2
    try:
        full = resolve(args.full)
    except (ValueError, ModelPathError) as e:
        print(f"counts: {e}", file=sys.stderr)
        return 2
    recount(args.student, full, prompts=args.prompts, threads=args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
