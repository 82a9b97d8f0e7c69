"""``StageRunner``: one model's share of an engine step, the same code in process and on a chip.

A runner owns a model (whole, a pipeline stage, and/or a tensor-parallel rank), its ``KVCache``
and, on the stage with the head, the sampling generators of the requests it samples, keyed by
KV-cache slot. ``LocalExecutor`` drives one runner over the whole model; every ``ChipWorker``
drives one over its shard.
"""

from __future__ import annotations

import torch

from .batch import Rows, StepBatch
from .kv_cache import KVCache
from .model import Llama
from .sampling import generator_for_seed, sample


class StageRunner:
    """Runs a step's row groups through ``model`` and, with the head, samples their tokens.

    Args:
        model: a loaded ``Llama`` (or stage, or TP rank).
        num_slots, max_len: of the ``KVCache`` built for it.
    """

    def __init__(self, model: Llama, *, num_slots: int, max_len: int | None = None) -> None:
        self.model = model
        self.cache = KVCache.for_model(model, num_slots=num_slots, max_len=max_len)
        self.device = next(model.parameters()).device
        self.generators: dict[int, torch.Generator] = {}

    def forward(self, parts: list[Rows], inputs: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Hidden states ``[B, S, D]`` per part; ``inputs`` are the previous stage's, else the tokens."""
        xs = inputs if inputs is not None else [r.tokens for r in parts]
        return [self.model(x.to(self.device), r.positions.to(self.device), r.slots.to(self.device), self.cache)
                for r, x in zip(parts, xs, strict=True)]

    def logits(self, parts: list[Rows], hidden: list[torch.Tensor],
               every_position: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Logits ``[B, V]`` at each row's last real token, and with ``every_position`` also ``[B, S, V]``.

        Under tensor parallelism every rank must call this (the head all-gathers).
        """
        last_logits, full = [], [] if every_position else None
        for r, h in zip(parts, hidden, strict=True):
            rows = torch.arange(r.num_rows, device=self.device)
            if every_position:
                all_logits = self.model.compute_logits(h)  # [B, S, V]
                full.append(all_logits)
                last_logits.append(all_logits[rows, r.last.to(self.device)])
            else:
                last_logits.append(self.model.compute_logits(h[rows, r.last.to(self.device)]))  # [B, V]
        return last_logits, full

    def update_generators(self, batch: StepBatch) -> None:
        """Forget the generators of freed slots; make those of newly admitted sampled requests."""
        for slot in batch.freed:
            self.generators.pop(slot, None)
        for slot, seed in batch.seeds.items():
            self.generators[slot] = generator_for_seed(seed, self.device)

    def sample(self, parts: list[Rows], logits: list[torch.Tensor]) -> list[list[int]]:
        """One token per row of each part (call ``update_generators`` for the step first)."""
        out = []
        for r, lg in zip(parts, logits, strict=True):
            gens = [None if p.greedy else self.generators[s] for p, s in zip(r.params, r.slots.tolist(),
                                                                             strict=True)]
            out.append(sample(lg, r.params, gens).tolist())
        return out
