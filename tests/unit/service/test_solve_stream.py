"""A ``/solve`` stream gives the event loop a turn between answers."""

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable

import pytest
from blendserve.scheduler import Job, JobSpec, Question
from blendserve.service.solve.handlers import collect, ndjson_lines, sse_frames

from tests.support.fake_engine import FakeEngine, last_word

COUNT = 40


def _job() -> Job:
    # Every sample in flight at once, each answer final with its sample: the
    # answers come out in one burst, with nothing for the job to wait on between.
    engine = FakeEngine({str(i): [("1", 1.0)] for i in range(COUNT)})
    questions = [Question(id=str(i), prompt="x") for i in range(COUNT)]
    spec = JobSpec(questions=questions, budget=COUNT, concurrency=COUNT, in_flight_per_question=1)
    return Job(spec, engine, last_word)


@pytest.mark.parametrize("render", [sse_frames, ndjson_lines])
def test_a_burst_of_answers_lets_the_loop_run_between_them(
    render: Callable[[Job], AsyncIterator[str]],
) -> None:
    async def run() -> list[int]:
        turns = 0

        async def tick() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        ticker = asyncio.ensure_future(tick())
        seen = []
        async for text in render(_job()):
            if text.startswith(("event: answer", '{"event": "answer"')):
                seen.append(turns)
        ticker.cancel()
        return seen

    seen = asyncio.run(asyncio.wait_for(run(), 30))
    assert len(seen) == COUNT
    # the loop ran (other requests, /health) between every two answers written
    assert all(b > a for a, b in itertools.pairwise(seen)), seen


def test_collect_answers_every_question_of_a_burst() -> None:
    response = asyncio.run(asyncio.wait_for(collect(_job()), 30))
    assert response.status == "completed"
    assert [a.index for a in response.answers] == list(range(COUNT))
