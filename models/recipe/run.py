"""The whole recipe in one command: ``python -m models.recipe [--recipe shipped] [--out models/test]``.

corpus -> tokenizer -> pre-train full -> write full -> distill fast from the written full ->
write fast -> measure final losses -> write ``training.json`` per model and ``models/test/README.md``.
Every stage is resumable: rerun the same command after an interruption and it continues from
``--work-dir``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from . import corpus
from .card import write_readme
from .config import RECIPES, Recipe
from .data import encode_files, eval_windows
from .export import count_parameters, load_fp32, new_model, write_checkpoint
from .tokenizer import BOS, EOS, PAD, save_hf_tokenizer, train_tokenizer
from .train import distill_loss, held_out_loss, next_token_loss, train, use_bf16_autocast

MODELS_DIR = Path(__file__).resolve().parents[1] / "test"


def _tokenizer(recipe: Recipe, train_files: list[corpus.SourceFile], work_dir: Path) -> Tokenizer:
    tok_dir = work_dir / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        texts, used = [], 0
        for f in train_files:
            if used >= recipe.tokenizer_sample_bytes:
                break
            texts.append(f.text)
            used += len(f.text.encode("utf-8"))
        tok = train_tokenizer(texts, recipe.vocab_size)
        save_hf_tokenizer(tok, tok_dir, recipe.max_positions)
    return Tokenizer.from_file(str(tok_dir / "tokenizer.json"))


def run(recipe: Recipe, out_dir: Path, work_dir: Path) -> dict:
    """Make both checkpoints under ``out_dir``; return the stats written to their cards."""
    started = time.time()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    files = corpus.list_files()
    train_files, held_files = corpus.split(files)
    if recipe.max_train_files is not None:
        train_files = train_files[: recipe.max_train_files]
        held_files = held_files[:3]
    tok = _tokenizer(recipe, train_files, work_dir)
    special = {"bos": tok.token_to_id(BOS), "eos": tok.token_to_id(EOS), "pad": tok.token_to_id(PAD)}
    train_stream = encode_files(tok, train_files, special["bos"], special["eos"])
    held_stream = encode_files(tok, held_files, special["bos"], special["eos"])
    seq = recipe.pretrain.seq_len
    held_windows = eval_windows(held_stream, seq, max_windows=64).to(device)
    train_windows = eval_windows(train_stream, seq, max_windows=64).to(device)

    common = dict(
        corpus_files=len(files), train_files=len(train_files), held_out_files=len(held_files),
        corpus_sha256=corpus.corpus_hash(files), held_out_rule=(
            f"sha256(relative path) % {corpus.HELD_OUT_MODULUS} == 0"),
        train_tokens=int(train_stream.numel()), held_out_tokens=int(held_stream.numel()),
        python=platform.python_version(), stdlib=str(corpus.stdlib_root()), torch=torch.__version__,
        device=str(device), bf16_autocast=use_bf16_autocast(), recipe=recipe.to_dict(),
    )

    # 1. Pre-train full.
    torch.manual_seed(recipe.seed)
    full = new_model(recipe.full, vocab_size=recipe.vocab_size, max_positions=recipe.max_positions,
                     special=special).to(device)
    full_state = train(name="full", model=full, loss_fn=next_token_loss, stream=train_stream,
                       eval_windows=held_windows, sched=recipe.pretrain, seed=recipe.seed,
                       work_dir=work_dir, eval_every=recipe.eval_every,
                       checkpoint_every=recipe.checkpoint_every)
    write_checkpoint(full, work_dir / "tokenizer", out_dir / "full")

    # 2. Distill fast from the *shipped* full (bf16 weights upcast), so the teacher is what users get.
    teacher = load_fp32(out_dir / "full").to(device)
    torch.manual_seed(recipe.seed + 1)
    fast = new_model(recipe.fast, vocab_size=recipe.vocab_size, max_positions=recipe.max_positions,
                     special=special).to(device)
    fast_state = train(name="fast", model=fast,
                       loss_fn=distill_loss(teacher, recipe.kd_temperature, recipe.kd_weight),
                       stream=train_stream, eval_windows=held_windows, sched=recipe.distill,
                       seed=recipe.seed + 1, work_dir=work_dir, eval_every=recipe.eval_every,
                       checkpoint_every=recipe.checkpoint_every)
    write_checkpoint(fast, work_dir / "tokenizer", out_dir / "fast")

    # 3. Final losses of the shipped (bf16) weights, measured in fp32.
    stats = {}
    for name, state, sched in (("full", full_state, recipe.pretrain), ("fast", fast_state, recipe.distill)):
        shipped = load_fp32(out_dir / name).to(device)
        stats[name] = dict(
            common,
            name=name,
            parameters=count_parameters(shipped),
            config=json.loads((out_dir / name / "config.json").read_text()),
            steps=state["step"],
            train_seconds=round(state["seconds"], 1),
            tokens_seen=state["step"] * sched.batch_size * sched.seq_len,
            final_train_loss=round(held_out_loss(shipped, train_windows), 4),
            final_held_out_loss=round(held_out_loss(shipped, held_windows), 4),
            held_out_curve=state["held_out"],
            seed=recipe.seed if name == "full" else recipe.seed + 1,
            objective=("next-token cross-entropy" if name == "full" else
                       f"{recipe.kd_weight} * KL(full || fast) at T={recipe.kd_temperature}"
                       f" + {1 - recipe.kd_weight:.1f} * cross-entropy"),
        )
        (out_dir / name / "training.json").write_text(json.dumps(stats[name], indent=2) + "\n")
    if stats["fast"]["parameters"] * 4 > stats["full"]["parameters"]:
        raise ValueError("fast must have at most a quarter of full's parameters")
    write_readme(out_dir, stats, wall_seconds=time.time() - started)
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.recipe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", choices=sorted(RECIPES), default="shipped")
    p.add_argument("--out", type=Path, default=MODELS_DIR, help="where full/ and fast/ are written")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="resumable state (default: <out>/.work/<recipe>)")
    args = p.parse_args(argv)
    recipe = RECIPES[args.recipe]
    work_dir = args.work_dir or args.out / ".work" / recipe.name
    torch.set_num_threads(max(1, torch.get_num_threads()))
    stats = run(recipe, args.out, work_dir)
    for name, s in stats.items():
        print(f"{name}: {s['parameters']:,} params, train loss {s['final_train_loss']}, "
              f"held-out loss {s['final_held_out_loss']}", file=sys.stderr)
    return 0
