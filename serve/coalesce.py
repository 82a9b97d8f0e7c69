"""``coalesce``: batch a fast async stream into chunks, at most one per window.

Ray Serve spends a fixed CPU cost on every streamed item, so a lane that yields one item per
token caps its tokens/s at the inverse of that cost and burns CPU doing so. The first item is
passed on at once (time to first token is never traded away), and so is an item that ends the
stream (``final``: holding the last tokens back would only delay the end). Everything else that
arrives within the window after the previous chunk travels together.

The window adapts (with ``min_interval_s``): it is the measured cost of handing one chunk on
(the time the consumer, Ray Serve's replica, takes before it asks for the next) divided by
``overhead`` (2%), kept within ``[min_interval_s, interval_s]``. So a chunk costs the stream at
most ``overhead`` of its time, whether Serve is idle (short windows, text appears smoothly) or
loaded (longer windows, fewer items).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

T = TypeVar("T")
_END = object()


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def coalesce(source: AsyncIterator[T], interval_s: float, *, min_interval_s: float | None = None,
                   final: Callable[[T], bool] | None = None, overhead: float = 0.02) -> AsyncIterator[list[T]]:
    """Yield lists of ``source``'s items; closing this generator closes ``source`` (via its task).

    ``interval_s``: the window (the longest, with ``min_interval_s``); ``final(item)``: whether an
    item ends the stream (it goes at once with what came before it).
    """
    q: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in source:
                q.put_nowait(item)
        except Exception as e:  # noqa: BLE001 - re-raised on the consumer's side
            q.put_nowait(_Raised(e))
        finally:
            q.put_nowait(_END)

    def ends(x) -> bool:
        return x is _END or isinstance(x, _Raised) or (final is not None and final(x))

    task = asyncio.create_task(pump())
    last, cost = 0.0, 0.0
    try:
        while True:
            window = interval_s if min_interval_s is None else min(interval_s, max(min_interval_s, cost / overhead))
            items = [await q.get()]
            deadline = last + window
            while not ends(items[-1]):
                if not q.empty():
                    items.append(q.get_nowait())
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    items.append(await asyncio.wait_for(q.get(), left))
                except TimeoutError:
                    break
            last = time.monotonic()
            # The pump ends with _END, after at most one _Raised: pass on what came before them first.
            end = next((i for i, x in enumerate(items) if x is _END or isinstance(x, _Raised)), len(items))
            if end:
                t = time.monotonic()
                yield items[:end]
                cost = 0.8 * cost + 0.2 * (time.monotonic() - t) if cost else time.monotonic() - t
            if end < len(items):
                if isinstance(items[end], _Raised):
                    raise items[end].exc
                return
    finally:
        if not task.done():
            task.cancel()  # the source's own cleanup (abort in the engine) runs in the task
        await asyncio.gather(task, return_exceptions=True)
