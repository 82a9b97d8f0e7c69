"""``coalesce``: the first item at once, later ones batched per interval, early close reaches the source."""

from __future__ import annotations

import asyncio
import time

import pytest

from serve.stream import coalesce


async def ticker(n: int, every_s: float, log: list) -> None:
    try:
        for i in range(n):
            yield i
            await asyncio.sleep(every_s)
        log.append("exhausted")
    finally:
        log.append("closed")


def run(coro):
    return asyncio.run(coro)


def test_first_item_is_not_held_and_later_ones_are_batched():
    async def main():
        log, chunks, times = [], [], []
        start = time.monotonic()
        async for chunk in coalesce(ticker(40, 0.002, log), 0.05):
            chunks.append(chunk)
            times.append(time.monotonic() - start)
        return chunks, times, log

    chunks, times, log = run(main())
    assert chunks[0] == [0] and times[0] < 0.04
    assert [i for c in chunks for i in c] == list(range(40))  # nothing lost, duplicated or reordered
    assert len(chunks) < 10  # 40 items over ~90 ms, at most one chunk per 50 ms
    assert log == ["exhausted", "closed"]


def test_closing_early_closes_the_source():
    async def main():
        log = []
        gen = coalesce(ticker(1000, 0.001, log), 0.0)
        async for _ in gen:
            break
        await gen.aclose()
        await asyncio.sleep(0)
        return log

    assert run(main()) == ["closed"]


def test_errors_reach_the_consumer_after_the_items_before_them():
    async def failing():
        yield 1
        raise ValueError("boom")

    async def main():
        got = []
        with pytest.raises(ValueError, match="boom"):
            async for chunk in coalesce(failing(), 0.0):
                got += chunk
        return got

    assert run(main()) == [1]
