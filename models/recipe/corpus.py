"""The training corpus: the Python standard library source of the running interpreter.

Which files are in it, which are held out, and a hash that pins both, so that a model card can
say exactly what a checkpoint saw.

Rules (documented in models/README.md):
- every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``, sorted by relative path;
- except ``site-packages`` and test directories (a path part named ``test``, ``tests`` or
  ``idle_test``), which are mostly fixtures rather than library code;
- a file is **held out** when ``sha256(relative_path) % HELD_OUT_MODULUS == 0``; held-out files
  are never trained on and are what ``fastmode eval`` scores.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

EXCLUDED_PARTS = frozenset({"site-packages", "test", "tests", "idle_test", "__pycache__"})
HELD_OUT_MODULUS = 20  # about 5% of files


@dataclass(frozen=True)
class SourceFile:
    """One corpus file: its path relative to the stdlib root and its text."""

    rel_path: str
    text: str


def stdlib_root() -> Path:
    """Where the running interpreter's standard library lives."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(rel_path: str) -> bool:
    """Deterministic, path-only held-out rule (independent of file contents and of Python version)."""
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % HELD_OUT_MODULUS == 0


def list_files(root: Path | None = None) -> list[SourceFile]:
    """All corpus files, sorted by relative path. Undecodable files are skipped."""
    root = root or stdlib_root()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if EXCLUDED_PARTS.intersection(rel.parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append(SourceFile(rel.as_posix(), text))
    return out


def split(files: list[SourceFile]) -> tuple[list[SourceFile], list[SourceFile]]:
    """(train, held_out) by the held-out rule."""
    train = [f for f in files if not is_held_out(f.rel_path)]
    held = [f for f in files if is_held_out(f.rel_path)]
    return train, held


def corpus_hash(files: list[SourceFile]) -> str:
    """sha256 over (path, contents) of every file, in order: pins the exact corpus."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.rel_path.encode("utf-8") + b"\0")
        h.update(f.text.encode("utf-8") + b"\0")
    return h.hexdigest()
