"""A distilled student and its full model made into one standard checkpoint, cached.

``assemble(student_dir, full_dir)`` checks that ``full_dir`` holds the very tensors the student was
distilled against (``distilled.json``'s sha256 of them), then writes a Hugging Face checkpoint that
transformers, vLLM and fastmode's executor load like any other: the student's config and trained
tensors, the full model's shared tensors and tokenizer files. It lands in
``$FASTMODE_CACHE/distilled/<student hash>-<shared hash>/`` (default ``~/.cache/fastmode``) and is
reused while complete.

``python -m models.distill.assemble STUDENT FULL`` does it by hand and prints the path.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from .export import MANIFEST, WEIGHTS, tensors_sha256

STUDENT_FILES = ("config.json", "generation_config.json", "token_counts.json")
"""Files of the student folder the checkpoint carries (``token_counts.json``: ``sharding.draft_vocab``)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model")


class DistilledError(ValueError):
    """A student folder that cannot be assembled: unreadable, or another full model than its own."""

    code = "invalid_distilled_model"


def is_student(path: str | Path) -> bool:
    """Whether ``path`` is a student folder (``distilled.json`` and ``student.safetensors``)."""
    path = Path(path)
    return (path / MANIFEST).is_file() and (path / WEIGHTS).is_file()


def cache_dir() -> Path:
    """``models.gguf.cache_root()/distilled``."""
    from models.gguf import cache_root

    return cache_root() / "distilled"


def manifest(student_dir: str | Path) -> dict:
    try:
        return json.loads((Path(student_dir) / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise DistilledError(f"{student_dir}: cannot read {MANIFEST}: {e}") from None


def _stamp(full_dir: Path) -> list:
    """The full model's weight files as (path, size, mtime): unchanged files need no new hash."""
    return [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(full_dir.glob("*.safetensors"))]


def assemble(student_dir: str | Path, full_dir: str | Path) -> Path:
    """The whole checkpoint of the student at ``student_dir`` with the full model at ``full_dir``."""
    student_dir, full_dir = Path(student_dir), Path(full_dir)
    info = manifest(student_dir)
    names, want = info["shared"]["names"], info["shared"]["sha256"]
    out = cache_dir() / f"{info['student_sha256'][:16]}-{want[:16]}"
    stamp = _stamp(full_dir)
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        try:
            if json.loads((out / "source.json").read_text()).get("full_stamp") == stamp:
                _copy_student_files(student_dir, out)  # token counts added to the student since
                return out  # made from this very full model's files
        except (OSError, ValueError):
            pass
    try:
        have = tensors_sha256(full_dir, names)
    except KeyError as e:
        raise DistilledError(f"{student_dir} was distilled from a full model with {names}; {full_dir} has "
                             f"other tensors ({e.args[0]})") from None
    if have != want:
        source = info.get("full", {}).get("name", "its full model")
        raise DistilledError(f"{student_dir} was distilled from {source} (shared tensors sha256 {want[:16]}); "
                             f"{full_dir} holds other weights ({have[:16]}): serve the student with its own "
                             f"full model, or distill one from this one (fastmode distill)")
    tensors = {}
    for file in sorted(full_dir.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in names:
                if name in f.keys():
                    tensors[name] = f.get_tensor(name)
    with safe_open(str(student_dir / WEIGHTS), "pt") as f:
        for name in f.keys():
            tensors[name] = f.get_tensor(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".assembling-"))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        _copy_student_files(student_dir, tmp)
        for name in TOKENIZER_FILES:
            if (full_dir / name).is_file():
                shutil.copy2(full_dir / name, tmp / name)
        (tmp / "source.json").write_text(json.dumps({"student": str(student_dir.resolve()),
                                                     "full": str(full_dir.resolve()), "full_stamp": stamp,
                                                     "shared_sha256": want}) + "\n")
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide it from other users of a shared cache
        shutil.rmtree(out, ignore_errors=True)  # an incomplete one, or one made from another copy
        try:
            tmp.rename(out)
        except OSError:  # another process assembled it first
            if not (out / "model.safetensors").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _copy_student_files(student_dir: Path, out: Path) -> None:
    for name in STUDENT_FILES:
        src, dst = student_dir / name, out / name
        if src.is_file() and not (dst.is_file() and dst.read_bytes() == src.read_bytes()):
            tmp = dst.with_name(f".{name}.tmp")
            shutil.copy2(src, tmp)
            tmp.replace(dst)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m models.distill.assemble", description=__doc__.split("\n\n")[0])
    ap.add_argument("student")
    ap.add_argument("full")
    args = ap.parse_args(argv)
    try:
        print(assemble(args.student, args.full))
    except DistilledError as e:
        print(f"assemble: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
