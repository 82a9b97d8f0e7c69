"""``fastmode distill --full PATH --out DIR``: make the fast model from the full one.

Steps, each resumable (rerun the same command after an interruption; its work folder ``.<out>.work``
holds the full model's answers by shard, keyed by the settings they depend on, and the student's
checkpoint, keyed by all of them):
1. the student's shape for the fast lane's chips (``shape.choose``: how many layers);
2. the full model's greedy answers to ``prompts`` generated prompts, with its top-k distribution at
   every answer position (``teacher``); 5% of the prompts are held out;
3. which layers it keeps (``layers``: evenly spaced, or measured on a few of those answers);
4. the student, started from the full model's kept layers, trained on them (``train``);
5. the student folder written (``export``): its tensors, ``distilled.json``, the answers' token
   counts (``token_counts.json``, for the exact lane's pruned draft head) and a model card.

``--full`` takes a checkpoint folder, a GGUF file or ``builtin:NAME`` (``models.builtin``).
Runs on the GPU when one is present, else on the CPU's ``--threads`` cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

HELD_OUT_SHARE = 0.05


DATA_SETTINGS = ("prompts", "prompt_set", "max_new_tokens", "top_k", "seed")
"""The settings the full model's answers depend on (``gen_batch`` only groups them)."""


def _key(fingerprint: dict) -> str:
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def _machine(device: str, threads: int) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {threads} thread(s) of {os.cpu_count()} core(s)"


def distill(full: Path, out: Path, cfg, *, threads: int, full_name: str, work: Path | None = None,
            log=print) -> dict:
    """The whole run; returns the manifest written to ``out/distilled.json``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import export, shape, student, teacher, train
    from .card import card
    from .prompts import prompt_set

    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    full_config = json.loads((full / "config.json").read_text())
    chosen = shape.choose(full_config, speedup=cfg.speedup, chips=cfg.chips, device=cfg.device,
                          num_layers=cfg.num_layers)
    log(f"distill: student keeps {chosen.num_layers} of {full_config['num_hidden_layers']} layers "
        f"(planner: {chosen.predicted_tokens_per_s:.0f} vs {chosen.full_predicted_tokens_per_s:.0f} tokens/s per "
        f"user on {cfg.chips} {cfg.device} chip(s), {chosen.predicted_speedup:.2f}x)")
    tokenizer = AutoTokenizer.from_pretrained(full)
    model = AutoModelForCausalLM.from_pretrained(full, dtype=torch.float32).to(device).eval()
    shared_probe = student.build(model, chosen.keep[:1])
    shared = student.shared_names(shared_probe)
    del shared_probe
    # The work folder holds the full model's answers per data settings and the student per run
    # settings, so a run that only trains differently reuses the answers.
    full_sha = export.tensors_sha256(full, shared)
    settings = cfg.to_dict()
    data = {"full": full_sha, **{k: settings[k] for k in DATA_SETTINGS}}
    work = work or out.parent / f".{out.name}.work"
    answers_dir = work / f"answers-{_key(data)}"
    answers_dir.mkdir(parents=True, exist_ok=True)
    (answers_dir / "fingerprint.json").write_text(json.dumps(data, indent=2) + "\n")
    log(f"distill: work folder {work} (rerun the same command to resume)")

    prompts = prompt_set(cfg.prompts, cfg.seed, version=cfg.prompt_set)
    rows, answer_s = teacher.build(model, tokenizer, prompts, answers_dir, batch=cfg.gen_batch,
                                   max_new_tokens=cfg.max_new_tokens, top_k=cfg.top_k)
    n_held = max(1, round(len(rows) * HELD_OUT_SHARE))
    train_rows, held_rows = rows[:-n_held], rows[-n_held:]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    keep, search = _kept_layers(model, chosen, cfg, train_rows, pad, answers_dir, log)
    log(f"distill: keeps layers {keep} ({cfg.layers})")
    run = {"full": full_sha, "keep": keep,
           # how the layers were chosen is in ``keep`` (so a spaced run keeps its key)
           "settings": {k: v for k, v in settings.items()
                        if k not in ("checkpoint_every", "gen_batch", "layers", "calibration_rows")}}
    student_dir = work / f"student-{_key(run)}"
    student_dir.mkdir(parents=True, exist_ok=True)
    (student_dir / "fingerprint.json").write_text(json.dumps(run, indent=2) + "\n")
    pupil = student.build(model, keep).to(device)
    del model
    stats = train.train(pupil, train_rows, held_rows, cfg, student_dir, pad)
    answer_tokens = sum(len(r["ids"]) - r["prompt_len"] for r in rows)
    manifest = {
        "full": {"name": full_name, "layers": full_config["num_hidden_layers"]},
        "keep": list(keep),
        "layer_search": search,
        "settings": cfg.to_dict(),
        "shape": {"predicted_tokens_per_s": chosen.predicted_tokens_per_s,
                  "full_predicted_tokens_per_s": chosen.full_predicted_tokens_per_s,
                  "predicted_speedup": chosen.predicted_speedup, "layout": chosen.layout},
        "data": {"prompts": len(rows), "train_prompts": len(train_rows), "held_out_prompts": len(held_rows),
                 "answer_tokens": answer_tokens, "prompt_seed": cfg.seed, "prompt_set": cfg.prompt_set},
        "held_out": {"before": stats["held_out_before"], "after": stats["held_out_after"]},
        "train": {"steps": stats["step"], "final_loss": stats["train_loss"], "train_s": stats["seconds"]},
        "run": {"answer_s_this_call": answer_s, "wall_s_this_call": time.perf_counter() - started,
                "machine": _machine(device, threads), "device": device, "torch": torch.__version__,
                "command": "fastmode distill " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["distill"] else [])},
        "parameters": sum(p.numel() for p in pupil.parameters()),
    }
    from sharding.draft_vocab import count_tokens

    export.write(pupil, out, full_dir=full, shared=shared, manifest=manifest, card=card(manifest, shared),
                 token_counts=count_tokens(answer_ids(rows)))
    log(f"distill: wrote {out}: held-out top-1 agreement with the full model "
        f"{stats['held_out_before']['top1_agreement']:.3f} -> {stats['held_out_after']['top1_agreement']:.3f}")
    return json.loads((out / export.MANIFEST).read_text())


def _kept_layers(model, chosen, cfg, rows: list[dict], pad: int, answers_dir: Path,
                 log) -> tuple[tuple[int, ...], list[dict] | None]:
    """The layers the student keeps and, for ``measured``, the search's rounds (kept beside the
    answers they were measured on, so a resumed run does not search again)."""
    if cfg.layers == "spaced":
        return chosen.keep, None
    from . import layers

    done = answers_dir / f"layers-measured-{chosen.num_layers}-{cfg.calibration_rows}-{cfg.ce_weight}.json"
    if done.exists():
        saved = json.loads(done.read_text())
        return tuple(saved["keep"]), saved["rounds"]
    keep, rounds = layers.measured(model, rows[: cfg.calibration_rows], chosen.num_layers, pad, cfg.ce_weight,
                                   log=log)
    done.write_text(json.dumps({"keep": list(keep), "rounds": rounds}, indent=2) + "\n")
    return keep, rounds


def answer_ids(rows: list[dict]) -> list[list[int]]:
    """The full model's answer tokens of each training row (its end-of-turn token included)."""
    return [r["ids"][r["prompt_len"]:] for r in rows]


def main(argv: list[str] | None = None) -> int:
    from .config import PRESETS

    ap = argparse.ArgumentParser(prog="fastmode distill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", required=True, help="the full model: a checkpoint folder, a GGUF file or builtin:NAME")
    ap.add_argument("--out", required=True, type=Path, help="the student folder to write")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="shipped",
                    help="settings to start from (shipped: what made models/fast; quick: seconds, for tests)")
    for name, kind in (("prompts", int), ("steps", int), ("num-layers", int), ("speedup", float), ("chips", int),
                       ("seed", int), ("max-new-tokens", int), ("batch-size", int), ("lr", float), ("top-k", int),
                       ("prompt-set", int)):
        ap.add_argument(f"--{name}", type=kind, default=None, help=f"override the preset's {name.replace('-', '_')}"
                        + (" (without --num-layers: the layer count the planner picks for it)" if name == "speedup"
                           else ""))
    ap.add_argument("--layers", choices=["spaced", "measured"], default=None,
                    help="which layers the student keeps: evenly spaced, or measured on the full model's answers "
                         "(default: the preset's)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="kind of chip the student's shape is chosen for (default: the preset's)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads on CPU")
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: beside --out, keyed by settings)")
    args = ap.parse_args(argv)
    from models.builtin import ModelPathError, resolve

    overrides = {k.replace("-", "_"): getattr(args, k.replace("-", "_"))
                 for k in ("prompts", "steps", "num-layers", "speedup", "chips", "seed", "max-new-tokens",
                           "batch-size", "lr", "top-k", "device", "layers", "prompt-set")}
    settings = {k: v for k, v in overrides.items() if v is not None}
    if args.speedup is not None and args.num_layers is None:
        settings["num_layers"] = None  # a wanted speed-up: the planner picks the count, not the preset
    try:
        cfg = replace(PRESETS[args.preset], **settings)
        full = resolve(args.full)
    except (ValueError, ModelPathError) as e:
        print(f"fastmode distill: {e}", file=sys.stderr)
        return 2
    from .shape import ShapeError

    try:
        distill(full, args.out, cfg, threads=args.threads, full_name=args.full, work=args.work)
    except ShapeError as e:
        print(f"fastmode distill: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
