"""Which of the full model's layers the student keeps: the ones whose loss it measures it can least do without.

``spaced`` keeps ``n`` evenly spaced layers, the first and the last included. ``measured`` starts
from every layer and drops, round by round, the layers whose removal alone raises the student's
loss on a few of the full model's answers least (the distillation loss of ``train.loss_of``, under
teacher forcing, before any training), several per round while many remain, one per round near
``n``. Layer pruning in the literature finds the same thing (ShortGPT, Men et al. 2024; Gromov et
al. 2024): a small model's middle and late-middle layers change its hidden state least, its first
and last layers most, so evenly spaced layers throw away some of the layers it needs. The search
runs the full model with layers left out (no copies), ``O(L^2 / 4)`` forward passes of a few
sequences.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .train import collate, loss_of

METHODS = ("measured", "spaced")
"""``DistillConfig.layers``: how the kept layers are chosen (``shape.spaced`` or ``measured``)."""


def per_round(remaining: int, n: int) -> int:
    """Layers dropped in a round with ``remaining`` left and ``n`` wanted: a quarter of the excess,
    at most 5, at least 1 (each round re-measures the rest, so the last drops are one at a time)."""
    return max(1, min((remaining - n) // 4, 5))


@torch.no_grad()
def measured(model, rows: list[dict], n: int, pad: int, ce_weight: float,
             log: Callable[[str], None] | None = None) -> tuple[tuple[int, ...], list[dict]]:
    """The ``n`` layers of ``model`` (a transformers causal LM whose decoder layers are
    ``model.model.layers``) kept by the greedy search above, scored on ``rows`` (teacher answers,
    as ``teacher.answer`` makes them), and the search's rounds (``dropped``, ``loss`` after)."""
    layers = model.model.layers
    total = len(layers)
    if not 1 <= n <= total:
        raise ValueError(f"cannot keep {n} of {total} layers")
    batch = collate(rows, pad)
    was_training, use_cache, num = model.training, model.config.use_cache, model.config.num_hidden_layers
    model.eval()
    model.config.use_cache = False

    def loss(keep: list[int]) -> float:
        model.model.layers = torch.nn.ModuleList([layers[i] for i in keep])
        model.config.num_hidden_layers = len(keep)
        return float(loss_of(model, batch, ce_weight)[0])

    keep, rounds = list(range(total)), []
    try:
        while len(keep) > n:
            scores = sorted((loss([k for k in keep if k != j]), j) for j in keep)
            dropped = [j for _, j in scores[: per_round(len(keep), n)]]
            keep = [k for k in keep if k not in dropped]
            rounds.append({"dropped": dropped, "kept": len(keep), "loss": loss(keep)})
            if log:
                log(f"distill: layers {len(keep)} of {total} kept (dropped {dropped}): loss {rounds[-1]['loss']:.3f}")
    finally:
        model.model.layers = layers
        model.config.num_hidden_layers = num
        model.config.use_cache = use_cache
        model.train(was_training)
    return tuple(keep), rounds
