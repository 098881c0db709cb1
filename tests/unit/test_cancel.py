"""within: a result that came in the step its caller was cancelled is handed to ``orphaned``."""

import asyncio

import pytest
from blendserve.util.cancel import within

from tests.support.running import run_coroutine


def test_a_result_that_came_as_its_caller_was_cancelled_is_orphaned_not_lost() -> None:
    async def main() -> list[int]:
        orphans: list[int] = []
        came = asyncio.Event()

        async def answer() -> int:
            came.set()  # this test resumes before the caller sees the result
            return 7

        caller = asyncio.ensure_future(within(answer(), 5.0, orphans.append))
        await came.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        return orphans

    assert run_coroutine(main()) == [7]


def test_a_result_the_caller_gets_or_a_cancelled_call_is_never_orphaned() -> None:
    async def main() -> tuple[int, list[int]]:
        orphans: list[int] = []
        got = await within(asyncio.sleep(0, 3), 5.0, orphans.append)
        started, never = asyncio.Event(), asyncio.Event()

        async def hang() -> int:
            started.set()
            await never.wait()
            return 4

        caller = asyncio.ensure_future(within(hang(), 5.0, orphans.append))
        await started.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        return got, orphans

    assert run_coroutine(main()) == (3, [])
