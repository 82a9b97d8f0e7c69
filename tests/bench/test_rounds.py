"""``bench.rounds``: the sign test's interval for a median, checked against scipy's binomial
distribution and by its coverage on samples drawn from a known median; the alternation's order."""

from __future__ import annotations

import random

import pytest
from scipy.stats import binom

from bench.rounds import median_interval, round_order


def scipy_rank(n: int, confidence: float = 0.95) -> int:
    """The largest k with P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2, by scipy."""
    k = 0
    while k < n // 2 and binom.cdf(k, n, 0.5) <= (1 - confidence) / 2:
        k += 1
    return k


@pytest.mark.parametrize("n", range(1, 41))
def test_order_statistics_match_scipys_binomial(n):
    xs = [float(i) for i in random.Random(n).sample(range(1000), n)]
    k = scipy_rank(n)
    got = median_interval(xs)
    if k == 0:
        assert got is None
    else:
        ordered = sorted(xs)
        assert got == (ordered[k - 1], ordered[n - k])
        # its coverage, 1 - 2 P(B <= k - 1), is at least 95%
        assert 1 - 2 * binom.cdf(k - 1, n, 0.5) >= 0.95


def test_nine_rounds_give_the_second_and_eighth():
    assert median_interval([0.87, 0.79, 0.95, 0.91, 0.93, 0.88, 0.96, 0.90, 0.92]) == (0.87, 0.95)
    assert median_interval([0.9, 0.8, 0.95]) is None  # too few rounds for any 95% interval


def test_covers_the_true_median_as_often_as_it_says():
    rng = random.Random(7)
    n, trials, hits = 9, 4000, 0
    for _ in range(trials):
        xs = [rng.expovariate(1.0) for _ in range(n)]  # skewed; median ln 2
        lo, hi = median_interval(xs)
        hits += lo <= 0.6931471805599453 <= hi
    assert hits / trials >= 0.95  # 0.961 in theory; 4000 draws put the estimate within about 0.006 of it


def test_rounds_alternate_the_order():
    assert [round_order("ABC", r) for r in range(3)] == [list("ABC"), list("CBA"), list("ABC")]
