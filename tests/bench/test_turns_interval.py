"""``bench.turns.ratio_interval``: the 95% bootstrap interval of turn N's median first token over turn
1's, against scipy's own paired percentile bootstrap of the same statistic."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from bench.turns import ratio_interval


def _scipy_interval(first, last, resamples):
    res = stats.bootstrap((np.asarray(first), np.asarray(last)),
                          lambda f, la, axis=-1: np.median(la, axis=axis) / np.median(f, axis=axis),
                          paired=True, vectorized=True, n_resamples=resamples, method="percentile",
                          confidence_level=0.95, random_state=np.random.default_rng(1))
    return res.confidence_interval.low, res.confidence_interval.high


@pytest.mark.parametrize("n,shift", [(12, 1.3), (8, 1.0), (40, 1.1)])
def test_agrees_with_scipy(n, shift):
    rng = np.random.default_rng(n)
    first = list(5 + rng.gamma(2.0, 1.0, n))  # heavy right tail, like a first token that met a busy step
    last = list(shift * (5 + rng.gamma(2.0, 1.0, n)))
    low, high = ratio_interval(first, last, resamples=20_000)
    ref_low, ref_high = _scipy_interval(first, last, 20_000)
    point = np.median(last) / np.median(first)
    assert low <= point <= high
    assert low == pytest.approx(ref_low, rel=0.03) and high == pytest.approx(ref_high, rel=0.03)


def test_one_conversation_gives_its_own_ratio_and_bad_input_is_an_error():
    assert ratio_interval([4.0], [6.0]) == pytest.approx((1.5, 1.5))
    with pytest.raises(ValueError, match="equally long"):
        ratio_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="non-empty"):
        ratio_interval([], [])
