"""One path for admission: check a request's limits, hold its slot, watch for its client leaving.

Every route runs its work inside :func:`admitted`; the slot is given back
when the block ends, or, for a stream, when the stream ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import Request

from blendserve.service.disconnect import ClientGone, while_connected
from blendserve.service.limits import Budget, HeldStreamingResponse, Passed, Prompt, Slot
from blendserve.service.state import service_of

__all__ = ["Admitted", "admitted"]

_T = TypeVar("_T")


class Admitted:
    """An admitted request: its :attr:`slot`, waits that end with the client, held streams."""

    def __init__(self, request: Request, slot: Slot) -> None:
        self.slot = slot
        self._request = request
        self.streaming = False

    async def wait(self, work: Awaitable[_T], *, on_gone: Callable[[], None] | None = None) -> _T:
        """Awaits ``work`` while the client stays.

        Raises:
            ClientGone: the client left (``work`` is cancelled, ``on_gone`` runs);
                the service answers 499.
        """
        try:
            return await while_connected(self._request, work)
        except ClientGone:
            if on_gone is not None:
                on_gone()
            raise

    def stream(
        self,
        content: AsyncIterator[str] | AsyncIterator[bytes],
        *,
        on_close: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> HeldStreamingResponse:
        """A streamed response that holds the slot until it ends (as HeldStreamingResponse)."""
        self.streaming = True
        return HeldStreamingResponse(content, self.slot, on_close=on_close, **kwargs)


@asynccontextmanager
async def admitted(
    request: Request,
    prompts: Mapping[str, Prompt],
    budget: Budget,
    *,
    param: str,
    passed: Passed | None = None,
) -> AsyncIterator[Admitted]:
    """Checks the request's limits and admits its questions for the block.

    ``prompts`` holds each question's prompt by the field that holds it (a
    question slot each), ``param`` names the field that lists them, and
    ``passed`` the fields sent upstream with each of its engine requests, if any.

    Raises:
        InvalidRequest: a limit is passed (422).
        EngineDown: the engine's own server is dead (503, saying why).
        ServiceOverloaded: too much runs now (429).
    """
    state = service_of(request)
    state.limits.check(prompts, budget, param=param, passed=passed)
    if (down := state.engine.down()) is not None:
        raise down
    held = Admitted(request, state.admission.admit(len(prompts), param=param))
    try:
        yield held
    finally:
        if not held.streaming:
            held.slot.release()
