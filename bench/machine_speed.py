"""How fast this machine is right now, for telling whether two sittings of one benchmark run are
like for like.

A run of ``make bench`` can span sittings (``fastmode bench all --resume``), and its goals compare
stages of different sittings (the lanes against ``llama-server`` and vLLM's server). On a shared
virtual machine the speed can move between sittings by a factor of two or more (decision 036),
which would make such ratios meaningless. The probe is what
batch-1 decode is bound by: a bfloat16 matrix-vector product the size of a small model's head
(49,152 x 576, 57 MB, far larger than the caches), on the threads a stage uses, timed in rounds;
the median round's weight bytes per second is the figure.

Usage: python -m bench.machine_speed [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

ROWS, COLS = 49_152, 576
"""The probe's matrix: SmolLM2-135M's head (vocabulary x hidden)."""
ROUNDS, ROUND_S = 15, 0.3
TOLERANCE = 0.15
"""How far (as a fraction) a sitting's speed may be from the first sitting's for ``--resume`` to
continue the run: a margin over the spread of the probe's medians back to back on a shared
machine (decision 036)."""


def probe(threads: int = 2, rounds: int = ROUNDS, round_s: float = ROUND_S) -> dict:
    """The machine's speed: ``gb_per_s`` (the median round's weight bytes per second) and every
    round's, with the probe's settings."""
    import torch

    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(ROWS, COLS, generator=g).to(torch.bfloat16)
        x = torch.randn(1, COLS, generator=g).to(torch.bfloat16)
        for _ in range(5):  # warm-up: the first products page the matrix in
            x @ w.T
        rates = []
        for _ in range(rounds):
            n, t = 0, time.perf_counter()
            while time.perf_counter() - t < round_s:
                x @ w.T
                n += 1
            rates.append(n * w.numel() * w.element_size() / (time.perf_counter() - t) / 1e9)
    finally:
        torch.set_num_threads(was)
    return {"gb_per_s": statistics.median(rates), "rounds_gb_per_s": rates, "threads": threads,
            "what": f"bfloat16 {ROWS}x{COLS} matrix-vector products, median of {rounds} rounds of {round_s} s"}


def moved(first: dict, now: dict, tolerance: float = TOLERANCE) -> float | None:
    """``now``'s speed over ``first``'s when it moved by more than ``tolerance`` either way, else ``None``."""
    ratio = now["gb_per_s"] / first["gb_per_s"]
    return ratio if abs(ratio - 1) > tolerance else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.machine_speed", description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    p = probe(args.threads)
    print(f"{p['gb_per_s']:.2f} GB/s ({p['what']}, {args.threads} threads; rounds "
          f"{', '.join(f'{r:.2f}' for r in p['rounds_gb_per_s'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
