"""Training the student on the full model's answers: resumable, seeded, with a progress bar.

Loss per answer token: ``(1 - ce_weight)`` x the cross-entropy of the student's distribution to the
full model's top-k distribution (renormalized over its k tokens; equal, up to a constant, to the
KL divergence on them) plus ``ce_weight`` x the cross-entropy of the full model's own greedy token.
Only answer positions are scored (the prompt is the full model's input, not its output).

Batches depend only on ``(seed, step)`` (a fresh permutation of the training rows per epoch), and
the student, optimizer and step are checkpointed every ``checkpoint_every`` steps, so a resumed run
is the run that would have happened. Held-out rows report the top-1 agreement with the full model
under teacher forcing: the share of answer tokens a greedy drafter would get accepted.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from models.recipe.config import Schedule
from models.recipe.train import lr_at, use_bf16_autocast

from .config import DistillConfig
from .student import answer_logits


def collate(rows: list[dict], pad: int) -> dict[str, torch.Tensor]:
    """Right-padded inputs and, flat over the batch, each answer token's position and targets."""
    width = max(len(r["ids"]) for r in rows) - 1
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    positions, topk_ids, topk_logp, greedy = [], [], [], []
    for b, r in enumerate(rows):
        seq = torch.tensor(r["ids"][:-1])
        ids[b, : len(seq)] = seq
        n = len(r["ids"]) - r["prompt_len"]
        # position p predicts token p + 1: answer token j is predicted at prompt_len - 1 + j
        positions.append(b * width + r["prompt_len"] - 1 + torch.arange(n))
        topk_ids.append(r["topk_ids"].long())
        topk_logp.append(r["topk_logp"].float())
        greedy.append(torch.tensor(r["ids"][r["prompt_len"]:]))
    return {"ids": ids, "positions": torch.cat(positions), "topk_ids": torch.cat(topk_ids),
            "topk_logp": torch.cat(topk_logp), "greedy": torch.cat(greedy)}


def loss_of(student, batch: dict, ce_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss, top-1 agreement count) of one collated batch."""
    logq = answer_logits(student, batch["ids"], batch["positions"])  # [N, V]
    target = torch.softmax(batch["topk_logp"], dim=-1)  # the teacher's top-k, renormalized
    kd = -(target * logq.gather(1, batch["topk_ids"])).sum(-1)
    ce = -logq.gather(1, batch["greedy"][:, None]).squeeze(1)
    loss = ((1 - ce_weight) * kd + ce_weight * ce).mean()
    agree = (logq.argmax(-1) == batch["greedy"]).sum()
    return loss, agree


@torch.no_grad()
def held_out(student, rows: list[dict], pad: int, ce_weight: float, batch_size: int) -> dict:
    """Loss and top-1 agreement with the full model on held-out rows (teacher forcing)."""
    was = student.training
    student.eval()
    total, agree, tokens = 0.0, 0, 0
    for i in range(0, len(rows), batch_size):
        batch = collate(rows[i : i + batch_size], pad)
        loss, a = loss_of(student, batch, ce_weight)
        n = batch["greedy"].numel()
        total, agree, tokens = total + loss.item() * n, agree + a.item(), tokens + n
    student.train(was)
    return {"loss": total / max(1, tokens), "top1_agreement": agree / max(1, tokens), "tokens": tokens}


def batch_rows(rows: list[dict], step: int, batch_size: int, seed: int) -> list[dict]:
    """The rows of ``step``: epoch ``e`` visits the rows in ``Random(seed + e)``'s permutation."""
    out = []
    for k in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(k, len(rows))
        order = list(range(len(rows)))
        random.Random(seed + epoch).shuffle(order)
        out.append(rows[order[offset]])
    return out


def train(student, rows: list[dict], held: list[dict], cfg: DistillConfig, work_dir: Path, pad: int) -> dict:
    """Train ``student`` for ``cfg.steps`` (resuming from ``work_dir/student.pt``); return its stats."""
    work_dir.mkdir(parents=True, exist_ok=True)
    ckpt = work_dir / "student.pt"
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    sched = Schedule(steps=cfg.steps, batch_size=cfg.batch_size, seq_len=0, lr=cfg.lr, warmup=cfg.warmup)
    state = {"step": 0, "train_loss": None, "seconds": 0.0, "held_out_before": None}
    trainable = {n for n, p in student.named_parameters() if p.requires_grad}
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        student.load_state_dict(saved["model"], strict=False)
        opt.load_state_dict(saved["optimizer"])
        state = saved["state"]
    if state["held_out_before"] is None:
        state["held_out_before"] = held_out(student, held, pad, cfg.ce_weight, cfg.batch_size)

    def save() -> None:
        tmp = ckpt.with_suffix(".tmp")
        model = {n: t for n, t in student.state_dict().items() if n in trainable}
        torch.save({"model": model, "optimizer": opt.state_dict(), "state": state}, tmp)
        tmp.replace(ckpt)

    bf16 = use_bf16_autocast()
    device = "cuda" if next(student.parameters()).is_cuda else "cpu"
    student.train()
    ema = state["train_loss"]
    bar = tqdm(total=cfg.steps, initial=state["step"], desc="student", unit="step", dynamic_ncols=True)
    while state["step"] < cfg.steps:
        step = state["step"]
        started = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, sched)
        batch = collate(batch_rows(rows, step, cfg.batch_size, cfg.seed), pad)
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = loss_of(student, batch, cfg.ce_weight)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        if not math.isfinite(value):
            raise FloatingPointError(f"distill: loss became {value} at step {step}")
        ema = value if ema is None else 0.95 * ema + 0.05 * value
        state.update(step=step + 1, train_loss=ema, seconds=state["seconds"] + time.perf_counter() - started)
        bar.set_postfix(loss=f"{ema:.3f}")
        bar.update(1)
        if state["step"] % cfg.checkpoint_every == 0 or state["step"] == cfg.steps:
            save()
    bar.close()
    state["held_out_after"] = held_out(student, held, pad, cfg.ce_weight, cfg.batch_size)
    return dict(state)
