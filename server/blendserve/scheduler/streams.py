"""Samples of several engine requests, merged in the order they end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence

from blendserve._cancel import cancel_all
from blendserve.engines.base import Engine, GenerateRequest, Sample

__all__ = ["merged"]


async def merged(
    engine: Engine, requests: Sequence[GenerateRequest]
) -> AsyncGenerator[list[Sample], None]:
    """The samples of ``requests`` as they end, whichever request each belongs to.

    Each item holds every sample that had ended when it was asked for (at
    least one): a caller that stops after an item has used all it paid for.
    The first request to fail raises here once the samples that ended before
    it were handed over; closing the generator early cancels every request
    still running.
    """
    arrivals: asyncio.Queue[Sample | BaseException | None] = asyncio.Queue()

    async def pump(request: GenerateRequest) -> None:
        try:
            stream = engine.stream(request)
            async with contextlib.aclosing(stream):
                async for sample in stream:
                    arrivals.put_nowait(sample)
        except Exception as exc:  # handed to the consumer, who raises it
            arrivals.put_nowait(exc)
        else:
            arrivals.put_nowait(None)

    tasks = [asyncio.ensure_future(pump(request)) for request in requests]
    running = len(tasks)
    try:
        while running:
            ended: list[Sample] = []
            item = await arrivals.get()
            while True:
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    ended.append(item)
                if arrivals.empty():
                    break
                item = arrivals.get_nowait()
            if ended:
                yield ended
    finally:
        await cancel_all(tasks)
