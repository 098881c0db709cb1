"""The samples in flight a pool's questions share: a wave waits for room, by priority."""

from __future__ import annotations

import asyncio
import heapq
import itertools

__all__ = ["Slots"]


class Slots:
    """``size`` samples in flight at once; a wave that does not fit waits, the lowest
    ``priority`` first (then the first to ask)."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiting: list[tuple[float, int, int, asyncio.Future[None]]] = []
        self._order: itertools.count[int] = itertools.count()

    @property
    def num_waiting(self) -> int:
        """Waves waiting for room (cancelled ones until they reach the front)."""
        return len(self._waiting)

    async def acquire(self, n: int, priority: float) -> None:
        """Takes ``n`` slots, once they are free and no wave of lower priority waits."""
        if not self._waiting and self.free >= n:
            self.free -= n
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), n, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(n)  # granted as we were cancelled: give it back
            raise

    def release(self, n: int) -> None:
        """Gives ``n`` slots back, and wakes the waves that now fit, in order."""
        self.free += n
        waiting = self._waiting
        while waiting:
            _, _, need, future = waiting[0]
            if future.cancelled():
                heapq.heappop(waiting)
                continue
            if self.free < need:
                break
            heapq.heappop(waiting)
            self.free -= need
            future.set_result(None)
