"""The v2 eval's generated instruction tasks: deterministic per seed, and graded leniently but
exactly (the ground truth passes in the forms a chat model writes it, wrong answers do not)."""

from __future__ import annotations

import pytest

from models.eval.tasks import KINDS, TaskError, first_candidate, generate, parse_number


def test_deterministic_per_seed_and_different_across_seeds():
    a = generate(90, seed=3)
    assert a == generate(90, seed=3)
    assert a != generate(90, seed=4)
    assert [s.kind for s in a[: len(KINDS)]] == list(KINDS)
    assert generate(90, seed=3)[:20] == generate(20, seed=3)  # more samples leave the first ones as they were


def test_the_grader_takes_the_ground_truth_and_rejects_wrong_answers():
    for s in generate(450, seed=0):
        assert s.messages[-1][0] == "user" and s.chat()[-1]["content"] == s.question
        assert s.grade(s.answer), s
        assert s.grade(f"The answer is {s.answer}."), s
        if s.candidates:
            for other in set(s.candidates) - {s.answer}:
                assert not s.grade(other) and not s.grade(f"It is {other}, not {s.answer}."), s
            assert s.grade(f"{s.answer}, not {next(iter(set(s.candidates) - {s.answer}))}")
        elif "@" in s.answer:
            assert not s.grade("x" + s.answer) and not s.grade(s.answer.replace("@", "@x"))
        else:
            assert not s.grade(str(int(s.answer) + 1)) and not s.grade("I do not know.")
            assert s.grade(f"First 1 + 1 = 2, then = {s.answer}")  # the number after the last '='
        assert s.baseline


def test_baselines_are_trivial():
    samples = generate(450, seed=0)
    by_kind = {k: [s.grade(s.baseline) for s in samples if s.kind == k] for k in KINDS}
    for kind in ("add", "convert", "extract_email"):
        assert not any(by_kind[kind]), kind  # these baselines can never be right
    assert 0 < sum(by_kind["extract_city"]) < len(by_kind["extract_city"])  # a coin toss


def test_parse_number():
    assert parse_number("3 + 4 = 7") == 7
    assert parse_number("The answer is 12.") == 12
    assert parse_number("4 * 60 = 240 seconds") == 240
    assert parse_number("That is 1,000 grams.") == 1000
    assert parse_number("7.0") == 7 and parse_number("2.5") == 2.5
    assert parse_number("no digits") is None


def test_first_candidate():
    c = ("pear", "apple", "plum")
    assert first_candidate("The last item is a plum, not a pear.", c) == "plum"
    assert first_candidate("PEAR", c) == "pear"
    assert first_candidate("pineapple", c) is None  # whole words only
    assert first_candidate("nothing here", c) is None


def test_unknown_kinds_are_refused():
    with pytest.raises(TaskError, match="unknown task kinds"):
        generate(3, kinds=("add", "poetry"))
    with pytest.raises(TaskError):
        generate(-1)
