"""Imports run one way: bench -> clients -> cluster -> serve -> sharding | models.

The contract lives in ``pyproject.toml`` (``[tool.importlinter]``) and is checked by import-linter
on the tree as it is, and on a copy of it with one back-arrow added, which must fail.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bench", "clients", "cluster", "serve", "sharding", "models")


def _lint(root: Path) -> subprocess.CompletedProcess:
    # import-linter puts its working directory first on sys.path, so it reads the tree at `root`.
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command;"
                           " sys.exit(lint_imports_command())", "--no-cache", "--no-logo"],
                          cwd=root, capture_output=True, text=True, timeout=300)


def _copy(tmp_path: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "results", "*.safetensors"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_the_layers_contract(tmp_path):
    proc = _lint(_copy(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout


def test_a_back_arrow_breaks_the_contract(tmp_path):
    root = _copy(tmp_path)
    with open(root / "sharding" / "kv_cache.py", "a") as f:
        f.write("\nfrom serve import config  # a back-arrow: sharding may not import serve\n")
    proc = _lint(root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "sharding is not allowed to import serve" in proc.stdout
    assert "sharding.kv_cache -> serve.config" in proc.stdout
