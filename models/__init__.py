"""The models fastmode serves by default, the test pair, the recipe that made it, the distillation
command and the quality eval.

The default pair (``serve/fastmode.yaml``): the full model is SmolLM2-135M-Instruct
(``builtin:smollm2-135m-instruct``, ``models.builtin``), the fast model is a student
distilled from it by ``fastmode distill`` (``models.distill``): ``DEFAULT_FAST``. The test pair (``TEST_FULL``,
``TEST_FAST``) are two small Llamas trained by ``models.recipe`` on the Python standard library,
which the test suite serves where it needs speed.
"""

from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent
FULL_BUILTIN = "builtin:smollm2-135m-instruct"
"""The default full model's path (``models.builtin``)."""
DEFAULT_FAST = MODELS_DIR / "fast"
"""The default fast model: a student of the default full model (``models/fast/README.md``)."""
TEST_FULL = MODELS_DIR / "test" / "full"
"""The test pair's full model: a small Llama code model trained on the Python standard library."""
TEST_FAST = MODELS_DIR / "test" / "fast"
"""The test pair's fast model: a quarter-size Llama distilled from ``TEST_FULL``."""
