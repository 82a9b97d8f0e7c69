"""Confidence intervals and paired comparisons of exact match, against references nobody here wrote:
Newcombe's published Wilson intervals, and scipy where it is installed."""

from __future__ import annotations

import math

import pytest

from models.eval.run import ModelScore, evaluate, table
from models.eval.samples import line_samples
from models.eval.stats import compare, mcnemar_exact, paired_bootstrap, wilson
from models.recipe import corpus

# Newcombe (1998), "Two-sided confidence intervals for the single proportion: comparison of seven
# methods", Statistics in Medicine 17:857-872, Table II, method 3 (score interval, no continuity correction).
NEWCOMBE = [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)]


@pytest.mark.parametrize(("k", "n", "low", "high"), NEWCOMBE)
def test_wilson_matches_the_published_table(k, n, low, high):
    got = wilson(k, n)
    assert got == pytest.approx((low, high), abs=5e-5)


def test_wilson_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for n in (1, 2, 7, 16, 320, 1000, 1001):
        for k in sorted({0, 1, 2, n // 20, n // 2, n - 1, n} & set(range(n + 1))):
            ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
            assert wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12), (k, n)


def test_wilson_rejects_impossible_counts():
    for k, n in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError):
            wilson(k, n)


def test_mcnemar_exact_by_hand_and_against_scipy():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 5) == 2 / 32  # both tails of Binomial(5, 1/2) at 0 and 5
    assert mcnemar_exact(1, 6) == pytest.approx(2 * (1 + 7) / 128)
    assert mcnemar_exact(4, 4) == 1.0
    stats = pytest.importorskip("scipy.stats")
    for b, c in ((3, 11), (10, 10), (40, 62), (0, 1), (120, 80)):
        assert mcnemar_exact(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9), (b, c)


def _pairs(both: int, a_only: int, b_only: int, neither: int) -> tuple[list[bool], list[bool]]:
    a = [True] * both + [True] * a_only + [False] * b_only + [False] * neither
    b = [True] * both + [False] * a_only + [True] * b_only + [False] * neither
    return a, b


def test_paired_comparison_on_a_constructed_example():
    # 1000 samples: both right on 40, only a on 30, only b on 10. a is 2 points better; the 40
    # discordant samples split 30/10, which chance alone gives with p = 2 * P(Bin(40, 1/2) <= 10).
    a, b = _pairs(40, 30, 10, 920)
    c = compare(a, b)
    assert c["difference"] == pytest.approx(0.02)
    assert (c["a_only_hits"], c["b_only_hits"]) == (30, 10)
    assert c["mcnemar_exact_p"] == pytest.approx(2 * sum(math.comb(40, i) for i in range(11)) / 2**40)
    assert c["significant"] and c["mcnemar_exact_p"] < 0.01
    low, high = c["difference_ci95"]
    # The normal approximation of the paired difference: sd = sqrt((b + c)/n - d^2)/sqrt(n).
    sd = math.sqrt((40 / 1000 - 0.02**2) / 1000)
    assert low == pytest.approx(0.02 - 1.96 * sd, abs=0.002) and high == pytest.approx(0.02 + 1.96 * sd, abs=0.002)
    assert 0 < low < 0.02 < high
    assert compare(a, b) == c  # fixed seed: the same interval every time
    # Swapped: the same evidence, the other sign; no difference: not significant.
    assert compare(b, a)["difference"] == pytest.approx(-0.02) and compare(b, a)["significant"]
    same = compare(*_pairs(40, 5, 5, 950))
    assert same["difference"] == 0 and same["mcnemar_exact_p"] == 1.0 and not same["significant"]
    assert same["difference_ci95"][0] < 0 < same["difference_ci95"][1]


def test_paired_bootstrap_agrees_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    import numpy as np

    a, b = _pairs(25, 18, 9, 348)
    ref = stats.bootstrap((np.array(a, float), np.array(b, float)), lambda x, y: x.mean() - y.mean(),
                          paired=True, vectorized=False, n_resamples=4000, method="percentile",
                          random_state=1).confidence_interval
    low, high = paired_bootstrap(a, b)
    assert low == pytest.approx(ref.low, abs=0.004) and high == pytest.approx(ref.high, abs=0.004)


def test_model_score_carries_its_interval_and_the_table_prints_it():
    s = ModelScore("full", 1.2, 50 / 1000, 50, 1000, 1.0)
    assert s.exact_match_ci95 == wilson(50, 1000)
    files = corpus.split(corpus.list_files())[1][:4]
    samples = line_samples(files, 20, seed=0)
    truth = {x.prefix: x.target for x in samples}

    class Oracle:
        name = "oracle"

        def complete(self, prompts, max_tokens):
            return [truth[p] for p in prompts]

        def nll(self, texts):
            return [1.0 for _ in texts]

    class Blank(Oracle):
        name = "blank"

        def complete(self, prompts, max_tokens):
            return ["" for _ in prompts]

    r = evaluate([Oracle(), Blank()], 20, 0, 8, max_files=4, per_sample=True)
    assert r["models"][0]["exact_match_ci95"] == wilson(20, 20)
    c = r["paired_with_first"]["blank vs oracle"]
    assert (c["difference"], c["a_only_hits"], c["b_only_hits"]) == (-1.0, 0, 20)
    assert c["mcnemar_exact_p"] == pytest.approx(2 / 2**20)
    assert [x["hits"] for x in r["per_sample"]] == [{"oracle": True, "blank": False}] * 20
    text = table(r)
    assert "100.0% [83.9, 100.0] (20/20)" in text and "-100.0 pts" in text


def test_the_held_out_files_give_1000_distinct_samples():
    """The default sample count (1000) draws distinct questions: distinct lines, distinct prompts."""
    samples = line_samples(corpus.split(corpus.list_files())[1], 1000, seed=0)
    assert len({(s.file, s.line_no) for s in samples}) == 1000
    assert len({(s.prefix, s.target) for s in samples}) == 1000
