"""How sure an exact-match figure is: confidence intervals and paired comparisons.

- ``wilson``: the Wilson score interval of one proportion (``k`` hits of ``n``). Unlike the normal
  approximation it stays inside [0, 1] and keeps its coverage near 0 and 1, where next-line exact
  match lives (a few percent).
- ``compare``: two systems scored on the *same* samples. Only the samples where exactly one of
  them is right carry information about the difference, so the test is paired: an exact McNemar
  test (a two-sided binomial test on the discordant pairs) and a paired bootstrap interval of the
  difference in exact match. Comparing two unpaired intervals would be far too conservative.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from statistics import NormalDist

import numpy as np

Z95 = NormalDist().inv_cdf(0.975)
"""The two-sided 95% standard-normal quantile (1.95996...)."""

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (low, high) for ``k`` successes in ``n`` trials (95% by default)."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # In exact arithmetic k = 0 gives low = 0 and k = n gives high = 1; floats may miss by an ulp.
    low = 0.0 if k == 0 else max(0.0, centre - half)
    high = 1.0 if k == n else min(1.0, centre + half)
    return low, high


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts: under "no difference" each
    discordant sample is equally likely to favour either system, so ``a_only ~ Binomial(a_only +
    b_only, 1/2)``; the p-value doubles the smaller tail (capped at 1)."""
    if a_only < 0 or b_only < 0:
        raise ValueError(f"discordant counts must be >= 0, got {a_only}, {b_only}")
    n = a_only + b_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(a_only, b_only) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))


def paired_bootstrap(a: Sequence[bool], b: Sequence[bool], resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile 95% interval of ``mean(a) - mean(b)`` over ``resamples`` paired bootstrap draws.

    A resample draws ``n`` samples with replacement and keeps each one's pair of outcomes; the
    difference depends only on how many drawn samples are "a only" and "b only", so each resample
    is drawn directly as a multinomial over the three kinds of sample (a only, b only, agree):
    the same distribution as resampling indices, in O(resamples) instead of O(resamples * n)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need two equally long, non-empty outcome lists, got {len(a)} and {len(b)}")
    n = len(a)
    a_only = sum(1 for x, y in zip(a, b) if x and not y)
    b_only = sum(1 for x, y in zip(a, b) if y and not x)
    counts = np.random.default_rng(seed).multinomial(n, [a_only / n, b_only / n, (n - a_only - b_only) / n],
                                                     size=resamples)  # [resamples, 3]
    diffs = (counts[:, 0] - counts[:, 1]) / n
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high)


def compare(a: Sequence[bool], b: Sequence[bool], resamples: int = BOOTSTRAP_RESAMPLES,
            seed: int = BOOTSTRAP_SEED) -> dict:
    """``a`` against ``b``, the per-sample hits of two systems on the same samples.

    Returns ``difference`` (exact match of a minus b), ``difference_ci95`` (paired bootstrap,
    ``bootstrap_resamples`` draws with ``bootstrap_seed``), ``a_only_hits`` and ``b_only_hits`` (the
    discordant samples), ``mcnemar_exact_p`` and ``significant`` (p < 0.05: the difference is
    unlikely to be chance)."""
    n = len(a)
    a_only = sum(1 for x, y in zip(a, b) if x and not y)
    b_only = sum(1 for x, y in zip(a, b) if y and not x)
    p = mcnemar_exact(a_only, b_only)
    return {"difference": (a_only - b_only) / n, "difference_ci95": list(paired_bootstrap(a, b, resamples, seed)),
            "bootstrap_resamples": resamples, "bootstrap_seed": seed, "a_only_hits": a_only,
            "b_only_hits": b_only, "mcnemar_exact_p": p, "significant": p < 0.05}


def pct_ci(k: int, n: int) -> str:
    """``"5.0% [3.8, 6.6]"``: a proportion and its Wilson 95% interval, in percent."""
    low, high = wilson(k, n)
    return f"{k / n:.1%} [{100 * low:.1f}, {100 * high:.1f}]"


def diff_text(c: dict) -> str:
    """``"-2.8 pts [-4.9, -0.8], p=0.01"``: a ``compare`` result, in percentage points."""
    low, high = c["difference_ci95"]
    return (f"{100 * c['difference']:+.1f} pts [{100 * low:+.1f}, {100 * high:+.1f}], "
            f"p={c['mcnemar_exact_p']:.2g}")
