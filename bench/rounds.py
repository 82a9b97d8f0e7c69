"""Measuring in alternated rounds: the order of each round, and a distribution-free interval for the
median of the rounds' figures.

This machine's speed drifts by more, over minutes, than many of the gaps the benchmarks measure.
Two sides measured in alternation (A B, B A, ...) meet the same drift; each round gives one ratio,
and the median of the rounds' ratios gets its interval from the rounds themselves.
"""

from __future__ import annotations

import math


def median_interval(xs: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of ``xs`` (independent rounds): the order statistics
    ``x(k)`` and ``x(n+1-k)`` with the largest ``k`` whose two tails each hold at most
    ``(1 - confidence) / 2`` of Binomial(n, 1/2) (the sign test's interval; its coverage is at least
    ``confidence``). ``None`` when ``xs`` is too short for one (fewer than 6 values at 95%)."""
    n, tail, k, below = len(xs), (1 - confidence) / 2, 0, 0.0
    while k < n // 2:
        below += math.comb(n, k) / 2 ** n  # P(Binomial(n, 1/2) <= k)
        if below > tail:
            break
        k += 1
    if k == 0:
        return None
    ordered = sorted(xs)
    return ordered[k - 1], ordered[n - k]


def round_order(items: list, r: int) -> list:
    """``items`` in the order of round ``r`` (from 0) of an alternation: as given in even rounds,
    reversed in odd ones (A B, B A, A B, ...), so that slow drift of the machine hits each alike."""
    return list(items) if r % 2 == 0 else list(items)[::-1]
