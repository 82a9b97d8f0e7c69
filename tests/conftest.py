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


SHARED_APP_CONFIG = "lanes:\n  exact: {compile: false}\n"
"""The shared app's config: the embedded default, but the exact lane's engine runs eager. Compiling
it (24 graphs, both models) is most of a cold start: the shared app took 809 s to start in a
clean-clone CI run (2026-11-26, this 2-core VM; the start timeout is 900 s). The compiled
speculative engine and its warm-up are tested in process (``tests/sharding/test_speculative.py``,
``tests/sharding/test_packed.py``); the fast lane stays compiled here."""


@pytest.fixture(scope="session")
def app(tmp_path_factory):
    """A getter for the running application (``fastmode up``, the embedded default config but for
    ``SHARED_APP_CONFIG``, API key required) shared by ``tests/clients`` and ``tests/serve``; it
    restarts the app if a test stopped it."""
    from tests.serve.conftest import App

    holder: dict[str, App] = {}
    config = tmp_path_factory.mktemp("shared-app") / "app.yaml"
    config.write_text(SHARED_APP_CONFIG)

    def get() -> App:
        if "app" not in holder or not holder["app"].running:
            holder["app"] = App("--config", str(config), probe_first_requests=True)
        return holder["app"]

    yield get
    if "app" in holder:
        holder["app"].stop()


def pytest_collection_modifyitems(config, items):
    """Run ``tests/serve/test_up.py`` (whose last test stops the shared app with Ctrl-C) after every
    other test in ``tests/serve``, and so after every test that uses the app (``tests/clients``
    sorts first); the sharding tests after it start a Ray of their own."""
    last = [i for i in items if i.nodeid.startswith("tests/serve/test_up.py")]
    rest = [i for i in items if i not in last]
    serve = [n for n, i in enumerate(rest) if i.nodeid.startswith("tests/serve/")]
    at = serve[-1] + 1 if serve else len(rest)
    items[:] = rest[:at] + last + rest[at:]
