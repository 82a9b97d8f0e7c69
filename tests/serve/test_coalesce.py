"""``coalesce``: the first item at once, later ones batched per interval, early close reaches the source."""

from __future__ import annotations

import asyncio
import time

import pytest

from serve.coalesce import coalesce


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


def test_the_end_is_not_held_and_the_window_adapts_to_the_cost_of_a_chunk():
    async def source(n: int):
        for i in range(n):
            yield i
            await asyncio.sleep(0.001)

    async def main(cost_s: float):
        chunks, times, start = [], [], time.monotonic()
        async for chunk in coalesce(source(60), 0.05, min_interval_s=0.002, final=lambda i: i == 59):
            chunks.append(chunk)
            times.append(time.monotonic() - start)
            await asyncio.sleep(cost_s)  # what handing a chunk on costs the consumer
        return chunks, times

    cheap, _ = run(main(0.0))
    dear, _ = run(main(0.002))  # 2 ms a chunk: windows of up to 50 ms (2 ms / 2%)
    for chunks in (cheap, dear):
        assert [i for c in chunks for i in c] == list(range(60)) and chunks[0] == [0]
    assert len(cheap) > 2 * len(dear)  # cheap chunks: short windows; dear ones: long windows


def test_the_last_item_is_not_held_for_the_window():
    async def source():
        for i in range(20):
            yield i
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.25)  # cleanup after the last item (an engine freeing its sequence)

    async def main(final):
        start, chunks = time.monotonic(), []
        async for chunk in coalesce(source(), 0.3, final=final):
            chunks.append((chunk, time.monotonic() - start))
        return chunks

    held = run(main(None))
    assert held[-1][1] >= 0.29  # without ``final`` the last items wait for the source's end
    sent = run(main(lambda i: i == 19))
    assert [i for c, _ in sent for i in c] == list(range(20)) and sent[-1][1] < 0.2
