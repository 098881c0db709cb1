"""Large request bodies reach the application one per turn of the event loop."""

import asyncio

from blendserve.service.limits import LARGE_BODY_BYTES, BodySizeLimit
from starlette.types import Message, Receive, Scope, Send


def _turns_at_hand_over(size: int, requests: int) -> list[int]:
    """The loop turn at which each of ``requests`` concurrent bodies reached the app."""

    async def run() -> list[int]:
        turns = 0
        seen: list[int] = []

        async def tick() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            message = await receive()
            assert len(message["body"]) == size
            seen.append(turns)  # where a real app would parse and validate it
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        limited = BodySizeLimit(app, max_bytes=1 << 20)

        async def one() -> None:
            async def receive() -> Message:
                return {"type": "http.request", "body": b"x" * size, "more_body": False}

            async def send(message: Message) -> None:
                pass

            await limited({"type": "http", "headers": []}, receive, send)

        ticker = asyncio.ensure_future(tick())
        await asyncio.gather(*(one() for _ in range(requests)))
        ticker.cancel()
        return seen

    return asyncio.run(asyncio.wait_for(run(), 10))


def test_large_bodies_arriving_together_are_handed_over_one_per_turn() -> None:
    seen = _turns_at_hand_over(LARGE_BODY_BYTES, 4)
    assert len(set(seen)) == 4, seen


def test_small_bodies_are_handed_over_at_once() -> None:
    seen = _turns_at_hand_over(LARGE_BODY_BYTES - 1, 4)
    assert len(set(seen)) == 1, seen
