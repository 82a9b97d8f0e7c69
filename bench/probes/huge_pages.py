"""Packed weights streamed from the huge-page arena against the same weights on ordinary pages.

Loads a model with packed weights (``sharding.packed``: all of them in one arena advised for
transparent huge pages), then times one pass over every packed linear with one input row (what a
batch-1 decode step streams), alternating between the arena and copies of the same weights in
separate ordinary tensors; the median of ``--repeats`` passes each. Prints (and with ``--json``
writes) both times, their ratio, the rate each streams at, and how much of this process's memory
the kernel backs with huge pages (``/proc/self/smaps_rollup``).

Usage: python -m bench.probes.huge_pages [--model DIR] [--threads 2] [--repeats 15] [--json FILE]
(default model: the default pair's full model, ``bench.pair``)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def anon_huge_kib() -> int | None:
    """KiB of this process's anonymous memory on huge pages (Linux), else ``None``."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def one_pass(owners: list, inputs: dict) -> float:
    t0 = time.perf_counter()
    for m in owners:
        torch.ops.fastmode.linear_bf16w(inputs[m.packed.shape[1]], m.packed)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.probes.huge_pages", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a checkpoint directory (default: the default pair's full model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args([str(a) for a in argv] if argv is not None else None)

    from sharding import packed
    from sharding.weights import load_model

    if args.model is None:
        from bench import pair
        args.model = pair.full()
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    packed.apply_packed_weights(model)
    owners = [m for m in model.modules() if isinstance(getattr(m, "packed", None), torch.Tensor)]
    arena = [m.packed for m in owners]
    plain = [p.clone() for p in arena]  # the same bytes, each its own allocation on ordinary pages
    inputs = {p.shape[1]: torch.randn(1, p.shape[1]) for p in arena}
    times: dict[str, list[float]] = {"arena": [], "plain": []}
    for _ in range(args.repeats):
        for name, buffers in (("arena", arena), ("plain", plain)):
            for m, b in zip(owners, buffers, strict=True):
                m.packed = b
            times[name].append(one_pass(owners, inputs))
    nbytes = sum(p.numel() * p.element_size() for p in arena)
    med = {k: statistics.median(v) for k, v in times.items()}
    doc = {"model": str(args.model), "threads": args.threads, "repeats": args.repeats, "linears": len(owners),
           "weight_bytes": nbytes, "arena_ms": med["arena"] * 1e3, "plain_ms": med["plain"] * 1e3,
           "arena_over_plain": med["arena"] / med["plain"],
           "arena_gb_per_s": nbytes / med["arena"] / 1e9, "plain_gb_per_s": nbytes / med["plain"] / 1e9,
           "anon_huge_kib": anon_huge_kib(),
           "thp": Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
           if Path("/sys/kernel/mm/transparent_hugepage/enabled").exists() else None}
    print(json.dumps(doc, indent=1))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
