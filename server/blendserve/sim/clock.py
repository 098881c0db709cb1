"""Modelled time for the real scheduler: an event loop whose clock skips idle waits."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualClockLoop", "run_virtual"]

T = TypeVar("T")


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer whenever nothing is ready to run.

    Modelled delays (``asyncio.sleep`` in the replay engine's latency model)
    then take no real time, while events keep the order real time would give
    them. For benchmarks and tests of the scheduler on recorded data; work
    waiting on threads or sockets takes no modelled time.
    """

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        """Modelled seconds since the loop was made."""
        return self._now

    def _run_once(self) -> None:
        # asyncio's own queues: callbacks ready now, and the timer heap.
        ready: Any = self._ready  # type: ignore[attr-defined]
        scheduled: Any = self._scheduled  # type: ignore[attr-defined]
        if not ready and scheduled:
            self._now = max(self._now, scheduled[0].when())
        super()._run_once()  # type: ignore[misc]


def run_virtual(main: Coroutine[Any, Any, T]) -> tuple[T, float]:
    """Runs ``main`` on a fresh :class:`VirtualClockLoop`: its result and the modelled seconds."""
    loop = VirtualClockLoop()
    try:
        result = loop.run_until_complete(main)
        return result, loop.time()
    finally:
        # As asyncio.run: what is left (an engine model's driver) is cancelled, not destroyed.
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
