"""Running a coroutine from a synchronous test, within a generous time limit."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_coroutine"]

T = TypeVar("T")


def run_coroutine(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """``coro``'s result, on a fresh event loop; a hang fails after ``timeout`` seconds."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
