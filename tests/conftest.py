"""Shared fixtures: tiny checkpoints made by the real recipe, and the shipped ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models import FAST, FULL

# Two cores: one intra-op thread per test process avoids oversubscription when tests spawn workers.
torch.set_num_threads(1)


def shipped(path: Path) -> Path:
    """The shipped checkpoint at ``path``, or skip the test when it is not there."""
    if not (path / "model.safetensors").exists():
        pytest.skip(f"shipped checkpoint {path} not present")
    return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> Path:
    """``<dir>/full`` and ``<dir>/fast`` made by the tiny recipe (a few seconds)."""
    from models.recipe.config import RECIPES
    from models.recipe.run import run

    out = tmp_path_factory.mktemp("tiny_models")
    run(RECIPES["tiny"], out, out / ".work")
    return out


@pytest.fixture(params=["full", "fast"])
def shipped_model(request) -> Path:
    """Each shipped checkpoint in turn."""
    return shipped({"full": FULL, "fast": FAST}[request.param])
