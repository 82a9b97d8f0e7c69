"""``fastmode bench turns`` starts its conversations one after another: each once the one before has
its first text, and never waits on one that failed."""

from __future__ import annotations

import asyncio

from bench.turns import _staggered, staggers


def test_each_conversation_starts_after_the_previous_first_text():
    order = []

    async def conversation(i, at, fail=False):
        async with _staggered(at):
            order.append(("start", i))
            await asyncio.sleep(0.01)
            if fail:
                raise RuntimeError("turn 0 failed")
            order.append(("first text", i))
            at.started.set()
            await asyncio.sleep(0.05)  # the rest of its turns run beside the next conversation's
            order.append(("end", i))

    async def main():
        ats = staggers(3)
        return await asyncio.gather(conversation(0, ats[0]), conversation(1, ats[1], fail=True),
                                    conversation(2, ats[2]), return_exceptions=True)

    results = asyncio.run(asyncio.wait_for(main(), 5))
    assert isinstance(results[1], RuntimeError) and results[0] is None and results[2] is None
    assert order.index(("start", 1)) > order.index(("first text", 0))
    assert order.index(("start", 1)) < order.index(("end", 0))  # out of step, not one after another
    assert order.index(("start", 2)) > order.index(("start", 1))  # after 1 failed, 2 still started
