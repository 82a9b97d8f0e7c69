"""The student's shape: the full model with fewer decoder layers, as many as the speed-up allows.

Keeping the full model's width, heads, vocabulary and tied head means the student starts from the
full model's own weights (its embedding, final norm and a subset of its layers, evenly spaced,
first and last kept) and shares its tokenizer, so it can draft for the exact tier. How many layers:
the planner (``sharding.planner``) predicts per-user decode tokens/s of a config on the fast lane's
chips; the student keeps the most layers whose prediction is at least ``speedup`` times the full
model's on the same chips. The prediction streams every weight from main memory (the chip's fast
memory is not counted on): a CPU core's share of a shared L3 is not its own, and a student chosen
because it would just fit fast memory is barely smaller than the full model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sharding.chips import load_chip
from sharding.planner import DEVICE_CHIP, plan


class ShapeError(ValueError):
    """No student shape meets the settings (the full model is too small to cut, or the speed-up is
    out of reach)."""

    code = "invalid_distill_shape"


@dataclass(frozen=True)
class StudentShape:
    keep: tuple[int, ...]
    """The full model's layer indices the student keeps, in order."""
    predicted_tokens_per_s: float
    """The planner's per-user decode prediction for the student on the target chips."""
    full_predicted_tokens_per_s: float
    """The same for the full model."""
    layout: str
    """The student's planned ``tp x pp``."""

    @property
    def num_layers(self) -> int:
        return len(self.keep)

    @property
    def predicted_speedup(self) -> float:
        return self.predicted_tokens_per_s / self.full_predicted_tokens_per_s


def spaced(total: int, n: int) -> tuple[int, ...]:
    """``n`` of ``total`` layer indices, evenly spaced, the first and the last included."""
    if not 1 <= n <= total:
        raise ShapeError(f"cannot keep {n} of {total} layers")
    if n == 1:
        return (0,)
    return tuple(round(i * (total - 1) / (n - 1)) for i in range(n))


def student_config(full_config: dict, keep: tuple[int, ...]) -> dict:
    """The full model's ``config.json`` with only ``keep``'s layers (per-layer lists cut to match)."""
    config = dict(full_config)
    config["num_hidden_layers"] = len(keep)
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = [config["layer_types"][i] for i in keep]
    return config


def choose(full_config: dict, *, speedup: float, chips: int, device: str, num_layers: int | None = None,
           dtype: str | None = None) -> StudentShape:
    """The student for ``full_config`` on ``chips`` chips of ``device`` (``num_layers`` given: that many)."""
    total = full_config["num_hidden_layers"]
    if total < 2:
        raise ShapeError(f"the full model has {total} layer(s): nothing to cut")
    chip = replace(load_chip(DEVICE_CHIP[device]), fast_memory_bytes=0.0)
    full_best, _ = plan(full_config, chip, chips, dtype)
    counts = [num_layers] if num_layers is not None else range(total - 1, 0, -1)
    for n in counts:
        if n >= total:
            raise ShapeError(f"num_layers {n} must be below the full model's {total}")
        keep = spaced(total, n)
        best, _ = plan(student_config(full_config, keep), chip, chips, dtype)
        shape = StudentShape(keep, best.tokens_per_s, full_best.tokens_per_s, f"{best.tp}x{best.pp}")
        if num_layers is not None or shape.predicted_speedup >= speedup:
            return shape
    raise ShapeError(f"even one layer does not reach a predicted {speedup}x over the full model on "
                     f"{chips} {device} chip(s) (the head dominates); lower --speedup")
