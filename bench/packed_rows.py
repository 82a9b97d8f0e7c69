"""Packed bfloat16 weights against MKL by rows per step: where ``MAX_ROWS`` should be.

``fastmode::linear_bf16w`` (``sharding/csrc/linear_bf16w.cpp``) serves steps of up to ``MAX_ROWS``
rows and hands larger ones to MKL's float32 GEMM. This builds a copy of the kernel without that
limit (``-DFASTMODE_MAX_ROWS``, its own build directory and op namespace), takes every linear
weight of the shipped full and fast models (what a speculative round streams), and times one pass
over all of them at each row count, the kernel and ``F.linear`` alternated, with the last-level
cache flushed before each pass (a step of the served engine finds the weights out of cache, the
other model and the KV cache having run in between). One intra-op thread, as the exact lane's
engine and each fast-lane chip run.

Usage: python -m bench.packed_rows [--rows 1,8,16,20,24,32,48,64,96,128,256,512] [--passes 15]
                                   [--threads 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from models import TEST_FAST, TEST_FULL
from sharding.packed import pack, packable

SOURCE = Path(__file__).resolve().parent.parent / "sharding" / "csrc" / "linear_bf16w.cpp"
FLUSH_BYTES = 64 << 20


def unlimited_kernel():
    """The shipped kernel's source built without a row limit, as op ``fastmode_rows::linear_bf16w``."""
    from torch.utils.cpp_extension import load

    build = Path(tempfile.gettempdir()) / "fastmode_packed_rows"
    build.mkdir(exist_ok=True)
    src = build / "linear_bf16w_rows.cpp"
    src.write_text(SOURCE.read_text().replace("TORCH_LIBRARY(fastmode,", "TORCH_LIBRARY(fastmode_rows,")
                   .replace("TORCH_LIBRARY_IMPL(fastmode,", "TORCH_LIBRARY_IMPL(fastmode_rows,"))
    load(name="fastmode_packed_rows", sources=[str(src)], build_directory=str(build), is_python_module=False,
         extra_cflags=["-O3", "-mavx2", "-mfma", f"-DFASTMODE_MAX_ROWS={1 << 40}"], verbose=False)
    return torch.ops.fastmode_rows.linear_bf16w


def model_weights() -> list[torch.Tensor]:
    """Every packable linear weight of the shipped full and fast models (the embeddings excepted)."""
    from sharding.weights import load_model

    out = []
    for path in (TEST_FULL, TEST_FAST):
        model = load_model(path)
        out += [m.weight.detach() for m in model.modules()
                if isinstance(m, torch.nn.Linear) and packable(m.weight.detach())]
    return out


def measure(rows: list[int], passes: int) -> list[dict]:
    kernel = unlimited_kernel()
    weights = model_weights()
    packed = [pack(w) for w in weights]
    flush = torch.ones(FLUSH_BYTES // 4)
    out = []
    for m in rows:
        xs = {k: torch.randn(m, k) for k in {w.shape[1] for w in weights}}

        def kernel_pass():
            for w, p in zip(weights, packed, strict=True):
                kernel(xs[w.shape[1]], p)

        def mkl_pass():
            for w in weights:
                F.linear(xs[w.shape[1]], w)

        x = xs[weights[0].shape[1]]
        torch.testing.assert_close(kernel(x, packed[0]), F.linear(x, weights[0]), rtol=1e-5, atol=1e-4)
        times: dict[str, list[float]] = {"kernel": [], "mkl": []}
        for i in range(passes + 2):
            for name, run in (("kernel", kernel_pass), ("mkl", mkl_pass)) if i % 2 == 0 else \
                    (("mkl", mkl_pass), ("kernel", kernel_pass)):
                flush.add_(1.0)  # the weights out of cache, as between a served engine's steps
                t0 = time.perf_counter()
                run()
                if i >= 2:  # the first two passes warm up
                    times[name].append(time.perf_counter() - t0)
        k, mk = statistics.median(times["kernel"]), statistics.median(times["mkl"])
        out.append({"rows": m, "kernel_ms": 1e3 * k, "mkl_ms": 1e3 * mk, "kernel_over_mkl": k / mk})
        print(f"{m:5d} rows: kernel {1e3 * k:8.2f} ms  MKL {1e3 * mk:8.2f} ms  kernel/MKL {k / mk:.2f}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = argparse.ArgumentParser(prog="python -m bench.packed_rows", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,8,16,20,24,32,48,64,96,128,256,512")
    ap.add_argument("--passes", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M")
    results = measure([int(r) for r in args.rows.split(",") if r], args.passes)
    if args.json:
        doc = {"date": started, "command": "python -m bench.packed_rows " + " ".join(argv),
               "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                           "processor": platform.processor()},
               "threads": args.threads, "results": results}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
