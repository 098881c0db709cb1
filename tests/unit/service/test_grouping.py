import asyncio
from typing import Any, TypeVar

from blendserve.engines.base import SamplingParams
from blendserve.scheduler import Question
from blendserve.service.jobs import JobDefaults, JobMaker, JobOptions
from blendserve.service.openai.grouping import Grouper

from tests.support.fake_engine import FakeEngine
from tests.support.running import run_coroutine

T = TypeVar("T")
SETTINGS = JobOptions("blend", "number", None, 0.0, SamplingParams(), None)


class _ByAskedId(dict[str, Any]):
    """Distributions by the id a request gave, whatever the grouper made of it."""

    def __getitem__(self, question_id: str) -> Any:
        return super().__getitem__(question_id.split(":", 1)[1])


# The grouper makes ids unique in the service: "g<questions it took before>:<id>".
DISTRIBUTIONS = _ByAskedId(a=[("1", 1.0)], b=[("2", 0.7), ("3", 0.3)], c=[("4", 1.0)])


def _grouper(engine: FakeEngine, wait: float = 10.0, max_questions: int = 3) -> Grouper:
    maker = JobMaker(engine, JobDefaults(concurrency=4, in_flight_per_question=0.5))
    return Grouper(maker, wait=wait, max_questions=max_questions)


def test_requests_share_one_job_whose_budget_is_the_sum() -> None:
    async def scenario() -> tuple[list[Any], int]:
        grouper = _grouper(FakeEngine(DISTRIBUTIONS, seed=1))
        first = grouper.submit(SETTINGS, [Question("a", prompt="a?")], 4)
        second = grouper.submit(
            SETTINGS, [Question("b", prompt="b?"), Question("c", prompt="c?")], 8
        )
        answers = await first.answers() + await second.answers()
        await grouper.aclose()
        return answers, grouper.jobs_started

    answers, jobs = run_coroutine(scenario())
    assert jobs == 1  # the third question filled the group: it started without waiting
    assert [a.answer for a in answers] == ["1", answers[1].answer, "4"]
    assert sum(a.samples for a in answers) == 4 + 8 + 8


def test_different_settings_never_share_a_job() -> None:
    async def scenario() -> int:
        grouper = _grouper(FakeEngine(DISTRIBUTIONS), wait=0.01)
        other = JobOptions("asc", "number", None, 0.0, SamplingParams(), None)
        tickets = [grouper.submit(s, [Question("c", prompt="c?")], 2) for s in (SETTINGS, other)]
        for ticket in tickets:
            assert [a.answer for a in await ticket.answers()] == ["4"]
        return grouper.jobs_started

    assert run_coroutine(scenario()) == 2


def test_a_request_answered_before_its_group_ends() -> None:
    async def scenario() -> tuple[int, int]:
        engine = FakeEngine(DISTRIBUTIONS, seed=2, latency=0.001)
        grouper = _grouper(engine, max_questions=2)
        settling = JobOptions("blend", "number", None, 0.05, SamplingParams(), None)
        sure = grouper.submit(settling, [Question("a", prompt="a?")], 100)
        slow = grouper.submit(settling, [Question("b", prompt="b?")], 100)
        (answer,) = await sure.answers()
        in_flight = engine.in_flight
        await slow.answers()
        return answer.samples, in_flight

    samples, in_flight = run_coroutine(scenario())
    assert samples < 20 and in_flight > 0


def test_abandoning_stops_the_question_and_the_job_when_nobody_waits() -> None:
    async def scenario() -> tuple[int, int]:
        engine = FakeEngine(DISTRIBUTIONS, stall=True)
        grouper = _grouper(engine)
        stay = grouper.submit(SETTINGS, [Question("a", prompt="a?")], 10)
        leave = grouper.submit(
            SETTINGS, [Question("b", prompt="b?"), Question("c", prompt="c?")], 10
        )
        await engine.started.wait()
        while engine.in_flight < 2:
            await asyncio.sleep(0)
        leave.abandon()
        while engine.cancelled < 1:
            await asyncio.sleep(0)
        in_flight = engine.in_flight
        stay.abandon()
        while engine.in_flight:
            await asyncio.sleep(0)
        await grouper.aclose()
        return in_flight, engine.cancelled

    in_flight_after_one, cancelled = run_coroutine(scenario())
    assert in_flight_after_one == 1 and cancelled == 2


def test_a_request_that_leaves_before_the_job_starts_is_left_out() -> None:
    async def scenario() -> tuple[list[Any], FakeEngine]:
        engine = FakeEngine(DISTRIBUTIONS)
        grouper = _grouper(engine, wait=0.05)
        gone = grouper.submit(SETTINGS, [Question("x", prompt="x?")], 4)
        gone.abandon()
        kept = grouper.submit(SETTINGS, [Question("c", prompt="c?")], 3)
        answers = await kept.answers()
        return answers, engine

    answers, engine = run_coroutine(scenario())
    assert [a.answer for a in answers] == ["4"]
    assert {r.question_id for r in engine.requests} == {"g1:c"}


def test_cancelling_the_running_jobs_answers_each_request_with_what_it_has() -> None:
    async def scenario() -> tuple[list[Any], int]:
        engine = FakeEngine(DISTRIBUTIONS, seed=3, latency=0.001)
        grouper = _grouper(engine, max_questions=2)
        tickets = [
            grouper.submit(SETTINGS, [Question(qid, prompt=f"{qid}?")], 1000) for qid in "ab"
        ]
        while len(engine.served) < 20:
            await asyncio.sleep(0.001)  # polls the count of samples served
        assert grouper.jobs.cancel_all("the service is shutting down") == 1
        answers = [a for t in tickets for a in await t.answers()]
        return answers, engine.in_flight

    answers, in_flight = run_coroutine(scenario())
    assert [a.answer for a in answers] == ["1", answers[1].answer]
    assert all(a.partial and 0 < a.samples < 1000 for a in answers)
    assert in_flight == 0
