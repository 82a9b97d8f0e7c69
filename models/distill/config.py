"""The settings of one distillation run: every one is written into the student's model card."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .prompts import PROMPT_SETS


@dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """What determines the student, given the full model (same settings and seed: the same student)."""

    speedup: float = 2.5
    """Wanted per-user decode speed-up of the student over the full model on the fast lane's chips,
    as the planner predicts it; the student keeps the most layers that reach it."""
    chips: int = 2
    """Chips of the fast lane the shape is chosen for."""
    device: str = "cpu"
    """Kind of chip the shape is chosen for (the planner's preset for it: ``cpu`` or ``cuda``)."""
    num_layers: int | None = None
    """Student layers; ``None``: chosen by ``speedup`` (``shape.choose``)."""
    layers: str = "spaced"
    """Which of the full model's layers it keeps: ``spaced`` (evenly, first and last included) or
    ``measured`` (a greedy search on the full model's answers, ``models.distill.layers``)."""
    calibration_rows: int = 8
    """Training rows (the full model's answers) the ``measured`` search scores each choice on."""
    prompts: int = 768
    """Prompts the full model answers (the training set)."""
    prompt_set: int = 1
    """Which generated prompts (``models.distill.prompts``): ``1`` instructions and code; ``2`` those
    and questions answered by copying from their own text, some after a worked example."""
    max_new_tokens: int = 96
    """Longest answer of the full model per prompt."""
    gen_batch: int = 16
    """Prompts the full model answers at once."""
    top_k: int = 32
    """Teacher log-probabilities kept per answer position (the rest of its distribution is dropped)."""
    steps: int = 600
    """Optimizer steps of the student."""
    batch_size: int = 8
    """Sequences per step."""
    lr: float = 3e-4
    """Peak learning rate (AdamW; linear warm-up, cosine decay to 10%)."""
    warmup: int = 30
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ce_weight: float = 0.1
    """Loss = (1 - ce_weight) * cross-entropy to the teacher's top-k distribution
    + ce_weight * cross-entropy of the teacher's own (greedy) token."""
    seed: int = 1234
    checkpoint_every: int = 50
    """Write the resumable student checkpoint every N steps."""

    def __post_init__(self) -> None:
        for name in ("chips", "prompts", "max_new_tokens", "gen_batch", "top_k", "steps", "batch_size",
                     "calibration_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"distill: {name} must be at least 1, got {getattr(self, name)}")
        if self.speedup <= 1.0:
            raise ValueError(f"distill: speedup must be above 1, got {self.speedup}")
        if not 0.0 <= self.ce_weight <= 1.0:
            raise ValueError(f"distill: ce_weight must be in [0, 1], got {self.ce_weight}")
        if self.prompt_set not in PROMPT_SETS:
            raise ValueError(f"distill: prompt_set must be one of {PROMPT_SETS}, got {self.prompt_set!r}")
        if self.layers not in ("spaced", "measured"):
            raise ValueError(f"distill: layers must be spaced or measured, got {self.layers!r}")
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"distill: num_layers must be at least 1, got {self.num_layers}")

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, DistillConfig] = {
    # models/fast (docs/decisions/032, 033): 12 measured layers on prompt set 2.
    "shipped": DistillConfig(num_layers=12, layers="measured", prompts=1536, prompt_set=2),
    # Seconds, for the test suite: a handful of prompts, a few steps.
    "quick": DistillConfig(prompts=8, max_new_tokens=12, gen_batch=4, top_k=8, steps=4, batch_size=2,
                           warmup=1, checkpoint_every=2),
}
"""``shipped`` made ``models/fast``; ``quick`` is the test suite's."""
