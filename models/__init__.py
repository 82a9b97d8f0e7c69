"""The shipped checkpoints (``FULL``, ``FAST``), the recipe that made them, and the quality eval."""

from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent
FULL = MODELS_DIR / "full"
"""The full model: a small Llama code model trained on the Python standard library."""
FAST = MODELS_DIR / "fast"
"""The fast model: a quarter-size Llama distilled from ``FULL``."""
