"""Cancellation helpers: work that is cancelled is also waited for.

A cancelled task's ``finally`` blocks (releasing counters, closing HTTP
requests) run only once it is scheduled again; these helpers wait for that, so
that nothing outlives the call that started it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

__all__ = ["DeadlinePassed", "all_or_cancel", "cancel_all", "within"]

_T = TypeVar("_T")


class DeadlinePassed(Exception):
    """The deadline of :func:`within` passed."""


async def cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancels ``tasks`` and waits until they are done (their finally blocks ran)."""
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: it is superseded by the error being raised


async def within(
    coro: Coroutine[Any, Any, _T],
    timeout: float,
    orphaned: Callable[[_T], object] | None = None,
) -> _T:
    """Awaits ``coro`` for at most ``timeout`` seconds, then cancels it.

    ``orphaned`` is given the result of a ``coro`` that ended in the step this
    call was cancelled in: the result exists, but the cancelled caller never
    gets it (an upstream's samples, made and billed).

    Raises:
        DeadlinePassed: the deadline passed first.
    """
    # Not asyncio.wait_for: on Python 3.10 and 3.11 it returns the result instead of
    # raising CancelledError when a cancellation races with completion, and the
    # caller's task then runs on as if never cancelled.
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout)
    except BaseException:
        await cancel_all([task])
        if orphaned is not None and not task.cancelled() and task.exception() is None:
            orphaned(task.result())
        raise
    if not done:
        await cancel_all([task])
        if task.cancelled():
            raise DeadlinePassed(f"{timeout:g} s")
    return task.result()


async def all_or_cancel(coros: Sequence[Coroutine[Any, Any, _T]]) -> list[_T]:
    """Awaits all; on the first error or on cancellation, cancels and awaits the rest."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # Siblings' finally blocks release outstanding counters before we re-raise.
        await cancel_all(tasks)
        raise
