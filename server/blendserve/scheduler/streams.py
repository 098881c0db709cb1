"""Samples of several engine requests, merged in the order they end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TypeVar

from blendserve.engines.base import Engine, GenerateRequest, Sample
from blendserve.stats import Stats
from blendserve.util.cancel import cancel_all

__all__ = ["deliver", "drain", "merged"]

T = TypeVar("T")


async def deliver(
    engine: Engine, request: GenerateRequest, put: Callable[[Sample], None], sink: Stats
) -> None:
    """Hands each sample of ``request`` to ``put`` as it ends; cancelled, the rest stop.

    The one ledger of samples in flight: ``sink`` counts the request's ``n`` in flight when
    it starts, one less as each is handed over and the rest when it ends, however it ends
    (as :meth:`Engine.counted_stream <blendserve.engines.base.Engine.counted_stream>` counts
    the engine's); a straggler a job no longer waits for stays in flight until it comes or
    its request ends. Each sample's tokens are reported as it is handed over, voting or
    not: the engine made it.
    """
    left = request.n
    sink.in_flight(left)
    try:
        stream = engine.counted_stream(request)
        async with contextlib.aclosing(stream):
            async for sample in stream:
                sink.tokens(sample.prompt_tokens, sample.completion_tokens)
                if left:  # an engine that sends more than asked counts none below 0
                    left -= 1
                    sink.in_flight(-1)
                put(sample)
    finally:
        sink.in_flight(-left)


async def drain(queue: asyncio.Queue[T]) -> list[T]:
    """Waits for an item of ``queue``, then takes every item there is."""
    items = [await queue.get()]
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


async def merged(
    engine: Engine, requests: Sequence[GenerateRequest], sink: Stats
) -> AsyncGenerator[list[Sample], None]:
    """The samples of ``requests`` as they end, each item every sample ended by then (at
    least one): a caller that stops after an item has used all it paid for. The first
    request to fail raises once the samples that ended before it were handed over; closing
    early cancels every request still running. ``sink`` is told as by :func:`deliver`."""
    arrivals: asyncio.Queue[Sample | BaseException | None] = asyncio.Queue()

    async def pump(request: GenerateRequest) -> None:
        try:
            await deliver(engine, request, arrivals.put_nowait, sink)
        except Exception as exc:  # handed to the consumer, who raises it
            arrivals.put_nowait(exc)
        else:
            arrivals.put_nowait(None)

    tasks = [asyncio.ensure_future(pump(request)) for request in requests]
    running = len(tasks)
    try:
        while running:
            ended: list[Sample] = []
            failed: BaseException | None = None
            for item in await drain(arrivals):
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    failed = failed or item
                else:
                    ended.append(item)
            if ended:
                yield ended
            if failed is not None:
                raise failed
    finally:
        await cancel_all(tasks)
