"""One resumable training loop, used for both pre-training (full) and distillation (fast).

The loop owns the optimizer, schedule, progress bar and checkpoint; the loss is passed in, so
pre-training and logit distillation differ only in ``loss_fn``. A checkpoint
(``<work_dir>/<name>.pt``: model, optimizer, step, losses) is written every
``checkpoint_every`` steps and on completion; a rerun resumes from it, and batches depend only on
``(seed, step)``, so a resumed run is the run that would have happened.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .config import Schedule
from .data import batch_at

LossFn = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]


def use_bf16_autocast() -> bool:
    """bf16 autocast pays on CPUs with native bf16 (their bf16 matmuls beat fp32 ones);
    FASTMODE_RECIPE_FP32=1 turns it off."""
    if os.environ.get("FASTMODE_RECIPE_FP32") == "1":
        return False
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def lr_at(step: int, sched: Schedule) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < sched.warmup:
        return sched.lr * (step + 1) / sched.warmup
    progress = (step - sched.warmup) / max(1, sched.steps - sched.warmup)
    return sched.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def next_token_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting ``batch[:, 1:]`` from ``batch[:, :-1]``."""
    logits = model(input_ids=batch[:, :-1]).logits.float()  # [B, S, V]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))


def distill_loss(teacher: torch.nn.Module, temperature: float, kd_weight: float) -> LossFn:
    """KL(teacher || student) on softened logits, plus a little cross-entropy on the true tokens."""

    def loss(student: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        inputs = batch[:, :-1]
        with torch.no_grad():
            t_logits = teacher(input_ids=inputs).logits.float()  # [B, S, V]
        s_logits = student(input_ids=inputs).logits.float()
        vocab = s_logits.size(-1)
        kl = F.kl_div(
            F.log_softmax(s_logits / temperature, -1).reshape(-1, vocab),
            F.log_softmax(t_logits / temperature, -1).reshape(-1, vocab),
            log_target=True,
            reduction="batchmean",
        ) * temperature**2
        ce = F.cross_entropy(s_logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        return kd_weight * kl + (1 - kd_weight) * ce

    return loss


@torch.no_grad()
def held_out_loss(model: torch.nn.Module, windows: torch.Tensor, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats/token) over fixed held-out windows, in fp32."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.size(0), batch_size):
        w = windows[i : i + batch_size]
        total += next_token_loss(model, w).item() * w.size(0)
        count += w.size(0)
    model.train(was_training)
    return total / count


def train(
    *,
    name: str,
    model: torch.nn.Module,
    loss_fn: LossFn,
    stream: torch.Tensor,
    eval_windows: torch.Tensor,
    sched: Schedule,
    seed: int,
    work_dir: Path,
    eval_every: int,
    checkpoint_every: int,
) -> dict:
    """Train ``model`` for ``sched.steps`` steps (resuming from ``work_dir/<name>.pt``); return stats."""
    work_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = work_dir / f"{name}.pt"
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": sched.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=sched.lr, betas=(0.9, 0.95),
    )
    state = {"step": 0, "train_loss": None, "held_out": [], "seconds": 0.0}
    if ckpt_path.exists():
        saved = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        state = saved["state"]

    def save() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "state": state}, tmp)
        tmp.replace(ckpt_path)  # atomic: an interrupted save never corrupts the checkpoint

    bf16 = use_bf16_autocast()
    device_type = "cuda" if next(model.parameters()).is_cuda else "cpu"
    model.train()
    ema = state["train_loss"]
    bar = tqdm(total=sched.steps, initial=state["step"], desc=name, unit="step", dynamic_ncols=True)
    while state["step"] < sched.steps:
        step = state["step"]
        started = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, sched)
        batch = batch_at(stream, step, sched.batch_size, sched.seq_len, seed).to(eval_windows.device)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), sched.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        if not math.isfinite(value):
            raise FloatingPointError(f"{name}: loss became {value} at step {step}")
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        state["step"] = step + 1
        state["train_loss"] = ema
        state["seconds"] += time.perf_counter() - started
        if state["step"] % eval_every == 0 or state["step"] == sched.steps:
            state["held_out"].append((state["step"], held_out_loss(model, eval_windows)))
            bar.set_postfix(loss=f"{ema:.3f}", held_out=f"{state['held_out'][-1][1]:.3f}")
        else:
            bar.set_postfix(loss=f"{ema:.3f}")
        bar.update(1)
        if state["step"] % checkpoint_every == 0 or state["step"] == sched.steps:
            save()
    bar.close()
    return dict(state)
