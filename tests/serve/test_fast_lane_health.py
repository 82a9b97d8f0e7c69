"""The fast lane's health check: a chip that does not answer is given ``UNANSWERED_CHECKS`` checks
in a row before the ring counts as failed; a dead chip fails it at once. (``ChipUnresponsive`` and
``RingFailed`` themselves, from real chips stopped and killed: ``tests/sharding/test_pipeline.py``.)"""

from __future__ import annotations

import asyncio

import pytest

from serve.errors import LaneUnavailable
from serve.lanes.sharded_engine import UNANSWERED_CHECKS, ShardedLaneEngine
from sharding.pipeline import ChipUnresponsive, RingFailed


class _Ring:
    """A ring whose ``check_alive`` answers from a script: ``None`` (alive) or the error to raise."""

    def __init__(self, answers):
        self.answers = list(answers)

    def check_alive(self) -> None:
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


def _engine(answers) -> ShardedLaneEngine:
    engine = ShardedLaneEngine.__new__(ShardedLaneEngine)  # no ring: only the health check's state
    engine.model, engine._error, engine.unanswered_checks = _Ring(answers), None, 0
    return engine


def test_a_chip_unanswered_fewer_times_in_a_row_than_the_limit_keeps_the_ring():
    slow = ChipUnresponsive("a chip did not answer within 10 s")
    answers = [slow] * (UNANSWERED_CHECKS - 1) + [None] + [slow] * (UNANSWERED_CHECKS - 1) + [None]
    engine = _engine(answers)
    for _ in answers:
        asyncio.run(engine.check_health())
    assert engine._error is None and engine.unanswered_checks == 0


def test_a_chip_unanswered_the_limit_in_a_row_fails_the_ring():
    engine = _engine([ChipUnresponsive("a chip did not answer within 10 s")] * UNANSWERED_CHECKS)
    for _ in range(UNANSWERED_CHECKS - 1):
        asyncio.run(engine.check_health())
    with pytest.raises(LaneUnavailable, match=f"{UNANSWERED_CHECKS} health checks in a row"):
        asyncio.run(engine.check_health())
    assert isinstance(engine._error, RingFailed)
    with pytest.raises(LaneUnavailable):  # and stays failed until the lane rebuilds it
        asyncio.run(engine.check_health())


def test_a_dead_chip_fails_the_ring_at_once():
    engine = _engine([RingFailed("a chip is gone: ActorDiedError")])
    with pytest.raises(LaneUnavailable, match="a chip is gone"):
        asyncio.run(engine.check_health())
    assert isinstance(engine._error, RingFailed)
