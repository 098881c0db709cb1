"""Waiting on work for a client that may leave: its work stops when it does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

from blendserve.util.cancel import cancel_all

__all__ = ["ClientGone", "while_connected"]

_T = TypeVar("_T")
_POLL_S = 0.2  # a gone client's work stops within this


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


async def while_connected(request: Request, work: Awaitable[_T]) -> _T:
    """Awaits ``work``; cancels it and raises :class:`ClientGone` if the client leaves."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone
    finally:
        if not task.done():
            await cancel_all([task])
