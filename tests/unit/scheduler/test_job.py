import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from blendserve.core import DEFAULT_POLICY, PolicySpec
from blendserve.core.stragglers import Stragglers
from blendserve.core.votes import VoteState
from blendserve.engines.base import GenerateRequest, Sample
from blendserve.errors import EngineProtocolError
from blendserve.scheduler import (
    AnswerEvent,
    DoneEvent,
    Job,
    JobSpec,
    JobStatus,
    ProgressEvent,
    Question,
)
from blendserve.scheduler.ballots import TRUNCATED_LIMIT, Ballots
from blendserve.testing.stats import RecordingStats

from tests.support.fake_engine import FakeEngine, last_word
from tests.support.running import run_coroutine

T = TypeVar("T")

DISTRIBUTIONS = {
    "easy": [("4", 0.95), ("5", 0.05)],
    "split": [("a", 0.55), ("b", 0.45)],
    "hard": [("x", 0.4), ("y", 0.35), ("z", 0.25)],
    "sure": [("yes", 1.0)],
}


def _spec(budget: int, **kwargs: Any) -> JobSpec:
    questions = [Question(id=qid, prompt=f"question {qid}") for qid in DISTRIBUTIONS]
    return JobSpec(questions=questions, budget=budget, **kwargs)


async def _events(job: Job) -> list[Any]:
    return [event async for event in job.events()]


def test_every_question_answered_once_and_the_budget_spent_exactly() -> None:
    engine = FakeEngine(DISTRIBUTIONS, seed=1)
    events = run_coroutine(_events(Job(_spec(60, concurrency=4), engine, last_word)))
    answers = [e for e in events if isinstance(e, AnswerEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.status is JobStatus.COMPLETED
    assert sorted(a.id for a in answers) == sorted(DISTRIBUTIONS)
    assert done.spent == done.usage.samples == len(engine.served) == 60
    assert sum(a.samples for a in answers) == 60
    by_id = {a.id: a for a in answers}
    assert by_id["sure"].answer == "yes" and by_id["sure"].votes == {"yes": by_id["sure"].samples}
    assert by_id["easy"].answer == "4"
    assert by_id["easy"].completion == "so it is 4"
    # Blend-ASC gives the contested questions more than the sure one.
    assert by_id["hard"].samples > by_id["sure"].samples


def test_concurrency_one_makes_the_simulators_choices() -> None:
    engine = FakeEngine(DISTRIBUTIONS, seed=2)
    spec = _spec(40, concurrency=1, seed=7)
    run_coroutine(_events(Job(spec, engine, last_word)))
    ids = list(DISTRIBUTIONS)
    # The same policy, fed the same answers in the same order, chooses the same
    # (built as the job builds it, so that ties are broken alike).
    policy = PolicySpec(DEFAULT_POLICY).build(len(ids), 40, seed=7, max_in_flight=40)
    for question_id, answer in engine.served:
        assert policy.select(1) == [ids.index(question_id)]
        policy.observe(ids.index(question_id), answer)
    assert policy.select(1) == []


def test_settling_ends_the_job_early_and_reports_the_unspent_budget() -> None:
    engine = FakeEngine({"a": [("1", 1.0)], "b": [("2", 1.0)]})
    spec = JobSpec([Question("a", "qa"), Question("b", "qb")], budget=200, settle_delta=0.05)
    events = run_coroutine(_events(Job(spec, engine, last_word)))
    done = events[-1]
    assert done.status is JobStatus.COMPLETED
    assert done.unspent > 150
    answers = [e for e in events if isinstance(e, AnswerEvent)]
    assert all(a.settled_early and a.confidence.ppr <= 0.05 for a in answers)


def test_failed_samples_are_refunded_and_retried() -> None:
    engine = FakeEngine(DISTRIBUTIONS, fail_next=3)
    done = run_coroutine(_events(Job(_spec(30, concurrency=2), engine, last_word)))[-1]
    assert done.status is JobStatus.COMPLETED
    assert done.spent == len(engine.served) == 30


def test_an_engine_that_keeps_failing_ends_the_job_with_partial_answers() -> None:
    engine = FakeEngine(DISTRIBUTIONS, fail_next=10**6)
    events = run_coroutine(_events(Job(_spec(30, max_consecutive_failures=5), engine, last_word)))
    done = events[-1]
    assert done.status is JobStatus.FAILED and "times in a row" in (done.error or "")
    answers = [e for e in events if isinstance(e, AnswerEvent)]
    assert len(answers) == 4 and all(a.partial and a.answer is None for a in answers)
    assert done.spent == 0


def test_a_question_the_ranking_keeps_first_takes_several_samples_per_request() -> None:
    engine = FakeEngine(DISTRIBUTIONS)
    spec = _spec(64, concurrency=16, in_flight_per_question=4, max_samples_per_request=8)
    run_coroutine(_events(Job(spec, engine, last_word)))
    assert max(r.n for r in engine.requests) > 1
    assert max(r.n for r in engine.requests) <= 8
    assert sum(r.n for r in engine.requests) == len(engine.served) == 64


class _OneSampleWhateverN(FakeEngine):
    """Returns the first sample of each request only, as an engine that ignores ``n`` would."""

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        samples = await super().generate(request)
        del self.served[len(self.served) - len(samples) + 1 :]
        return samples[:1]


def test_an_engine_that_returns_too_few_is_refunded_and_every_count_agrees() -> None:
    engine = _OneSampleWhateverN(DISTRIBUTIONS)
    spec = _spec(64, concurrency=16, in_flight_per_question=4, progress_interval=0)
    events = run_coroutine(_events(Job(spec, engine, last_word)))
    assert max(r.n for r in engine.requests) > 1  # so some answers were short
    answers = [e for e in events if isinstance(e, AnswerEvent)]
    progress = [e for e in events if isinstance(e, ProgressEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.status is JobStatus.COMPLETED
    # Only what came back is spent: the refunded shortfall went to other samples.
    served = Counter(q for q, _ in engine.served)
    assert {a.id: a.samples for a in answers} == dict(served)
    assert done.spent == done.usage.samples == len(engine.served) == 64
    assert all(p.completed <= p.spent <= p.budget for p in progress)
    assert (progress[-1].spent, progress[-1].completed) == (64, 64)


def test_a_protocol_error_keeps_its_type_in_the_summary() -> None:
    engine = FakeEngine(DISTRIBUTIONS)

    async def refuse(request: Any) -> Any:
        raise EngineProtocolError("upstream sent nonsense")

    engine.generate = refuse  # type: ignore[method-assign]
    done = run_coroutine(_events(Job(_spec(8), engine, last_word)))[-1]
    assert done.status is JobStatus.FAILED
    assert isinstance(done.cause, EngineProtocolError)
    assert "nonsense" in (done.error or "")


def test_abstaining_samples_are_spent_but_do_not_vote() -> None:
    engine = FakeEngine({"q": [("none", 0.5), ("7", 0.5)]}, seed=3)
    spec = JobSpec([Question("q", "p")], budget=20, policy=PolicySpec("blend"))
    events = run_coroutine(_events(Job(spec, engine, last_word)))
    (answer,) = [e for e in events if isinstance(e, AnswerEvent)]
    assert answer.samples == 20
    assert sum(answer.votes.values()) == Counter(a for _, a in engine.served)["7"] < 20


def test_closing_the_event_stream_cancels_every_request_in_flight() -> None:
    engine = FakeEngine(DISTRIBUTIONS, stall=True)

    async def scenario() -> None:
        stream = Job(_spec(40, concurrency=8), engine, last_word).events()
        consumer = asyncio.ensure_future(stream.__anext__())
        await engine.started.wait()
        assert engine.in_flight > 0
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        await stream.aclose()

    run_coroutine(scenario())
    assert engine.in_flight == 0
    assert engine.cancelled == len(engine.requests) > 0


def test_job_needs_questions() -> None:
    with pytest.raises(ValueError, match="at least one question"):
        Job(JobSpec([], budget=1), FakeEngine({}), last_word)


@pytest.mark.parametrize("bounds", [{"concurrency": 0}, {"max_samples_per_request": 0}])
def test_a_job_refuses_bounds_below_one(bounds: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be at least 1"):
        Job(JobSpec([Question("q", prompt="q")], budget=1, **bounds), FakeEngine({}), last_word)


def test_truncated_samples_do_not_vote() -> None:
    # Seed 7 draws cut, cut, 7: a vote before the third cut sample, so it goes on.
    engine = FakeEngine({"q": [("cut", 0.5), ("7", 0.5)]}, seed=7)
    events = run_coroutine(
        _events(Job(JobSpec([Question("q", "p")], budget=20), engine, last_word))
    )
    (answer,) = [e for e in events if isinstance(e, AnswerEvent)]
    assert "cut" not in answer.votes and answer.samples == 20 and answer.stopped is None
    assert answer.votes == {"7": Counter(a for _, a in engine.served)["7"]}


def test_answers_carry_the_finish_reason_of_the_completion_they_show() -> None:
    engine = FakeEngine({"all cut": [("cut", 1.0)], "some cut": [("cut", 0.5), ("7", 0.5)]})
    questions = [Question("all cut", "p"), Question("some cut", "p")]
    events = run_coroutine(_events(Job(JobSpec(questions, budget=20, seed=4), engine, last_word)))
    cut, fine = sorted((e for e in events if isinstance(e, AnswerEvent)), key=lambda e: e.index)
    assert cut.answer is None and cut.abstained == "so it is cut"
    assert cut.abstained_finish_reason == "length" and cut.finish_reasons == {}
    assert fine.answer == "7" and fine.finish_reasons == {"7": "stop"}


def test_cancel_ends_the_job_with_partial_answers_and_refunds_what_was_in_flight() -> None:
    async def scenario() -> tuple[list[Any], FakeEngine]:
        engine = FakeEngine(DISTRIBUTIONS, seed=4, latency=0.001)
        job = Job(_spec(4000, concurrency=4), engine, last_word)
        events = []
        async for event in job.events():
            events.append(event)
            if len(engine.served) >= 40 and job.status is JobStatus.RUNNING:
                job.cancel("shutting down")
                job.cancel("twice is a no-op")
        return events, engine

    events, engine = run_coroutine(scenario())
    answers = [e for e in events if isinstance(e, AnswerEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.status is JobStatus.CANCELLED
    assert done.error == "shutting down"
    assert sorted(a.id for a in answers) == sorted(DISTRIBUTIONS)
    assert all(a.partial != a.settled_early for a in answers)
    assert any(a.partial for a in answers)
    # Only what the engine served is spent: the cancelled requests were refunded.
    assert done.spent == sum(a.samples for a in answers) == len(engine.served) < 4000
    assert engine.in_flight == 0


def test_answers_given_at_once_are_built_one_at_a_time_as_they_are_read() -> None:
    # A cancelled job answers every open question at once; built in one go, ten
    # thousand of them would hold the event loop for a second.
    count = 40
    engine = FakeEngine({str(i): [("1", 1.0)] for i in range(count)}, stall=True)
    questions = [Question(id=str(i), prompt="x") for i in range(count)]
    sink = RecordingStats()
    spec = JobSpec(questions=questions, budget=2 * count, concurrency=count)
    job = Job(spec, engine, last_word, sink=sink)

    async def run() -> list[int]:
        seen: list[int] = []

        async def read() -> None:
            async for event in job.events():
                if isinstance(event, AnswerEvent):
                    seen.append(len(sink.of("answered")))

        reading = asyncio.ensure_future(read())
        await engine.started.wait()
        job.cancel("test")
        await reading
        return seen

    assert run_coroutine(run()) == list(range(1, count + 1))


def test_a_question_whose_samples_keep_being_cut_stops_and_leaves_its_budget_unspent() -> None:
    engine = FakeEngine({"cut": [("cut", 1.0)], "fine": [("7", 1.0)]})
    questions = [Question("cut", "p"), Question("fine", "p")]
    spec = JobSpec(questions, budget=200, settle_delta=0.05)
    events = run_coroutine(_events(Job(spec, engine, last_word)))
    cut, fine = sorted((e for e in events if isinstance(e, AnswerEvent)), key=lambda e: e.index)
    served = Counter(q for q, _ in engine.served)
    assert TRUNCATED_LIMIT <= cut.samples == served["cut"] <= 4
    assert cut.stopped == "truncated" and cut.answer is None and not cut.settled_early
    assert cut.abstained == "so it is cut" and cut.abstained_finish_reason == "length"
    assert fine.stopped is None and fine.answer == "7" and fine.settled_early
    assert fine.samples == served["fine"] > cut.samples
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.status is JobStatus.COMPLETED
    assert done.spent == done.usage.samples == cut.samples + fine.samples < done.budget


class _Stalling(FakeEngine):
    """``question`` against ``split``; its requests numbered as ``stalls`` says never return
    unless cancelled."""

    def __init__(self, question: str, stalls: Callable[[int], bool]) -> None:
        super().__init__({question: [(question, 1.0)], "split": [("a", 0.5), ("b", 0.5)]}, seed=5)
        self._question = question
        self._stalls = stalls
        self._asked = 0

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        if request.question_id == self._question:
            self._asked += 1
        self.stall = request.question_id == self._question and self._stalls(self._asked)
        return await super().generate(request)


def test_a_cut_question_cancels_its_requests_in_flight_and_answers_at_once() -> None:
    engine = _Stalling("cut", lambda n: n == 1)  # every "cut" sample is cut at max_tokens
    questions = [Question("cut", "p"), Question("split", "p")]
    spec = JobSpec(
        questions, budget=400, concurrency=8, in_flight_per_question=4, max_samples_per_request=1
    )

    async def scenario() -> tuple[list[Any], int]:
        job = Job(spec, engine, last_word)
        events: list[Any] = []
        served_when_cut_answered = -1
        async for event in job.events():
            events.append(event)
            if isinstance(event, AnswerEvent) and event.id == "cut":
                served_when_cut_answered = len(engine.served)
        return events, served_when_cut_answered

    events, served_when_cut_answered = run_coroutine(scenario())
    cut, split = sorted((e for e in events if isinstance(e, AnswerEvent)), key=lambda e: e.index)
    served = Counter(q for q, _ in engine.served)
    # Its stalled first request was cancelled (the job would hang otherwise) and refunded.
    assert engine.cancelled >= 1 and engine.in_flight == 0
    assert cut.stopped == "truncated" and cut.samples == served["cut"] >= TRUNCATED_LIMIT
    assert served_when_cut_answered < len(engine.served)  # answered before the job ended
    assert split.stopped is None and split.samples == served["split"]
    done = events[-1]
    assert done.spent == len(engine.served) == cut.samples + split.samples == 400


def test_a_question_that_settles_cancels_its_samples_in_flight_and_refunds_them() -> None:
    engine = _Stalling("sure", lambda n: n > 3)
    questions = [Question("sure", "p"), Question("split", "p")]
    # Uniform allocation sends each question 4 samples at once; "sure" settles at 3 votes.
    spec = JobSpec(
        questions, budget=40, policy=PolicySpec("sc"), concurrency=8, in_flight_per_question=4,
        max_samples_per_request=1, settle_delta=0.6,
    )  # fmt: skip
    events = run_coroutine(_events(Job(spec, engine, last_word)))
    sure, split = sorted((e for e in events if isinstance(e, AnswerEvent)), key=lambda e: e.index)
    # Its stalled samples could only end by being cancelled once it settled (the job
    # would wait for them otherwise); cut samples are refunded, never spent.
    assert sure.answer == "sure" and sure.settled_early and sure.samples == 3
    assert engine.in_flight == 0
    done = events[-1]
    assert done.cut >= engine.cancelled >= 1
    assert done.spent == len(engine.served) == 3 + split.samples


def _ballots(*samples: Sample) -> Ballots:
    async def add() -> Ballots:
        ballots = Ballots()
        for sample in samples:
            await ballots.add(sample, last_word)
        return ballots

    return asyncio.run(add())


CUT = Sample("so it is", "length", 5, 4, "fake")


def test_a_question_is_cut_by_truncated_samples_since_its_last_vote() -> None:
    seven = Sample("so it is 7", "stop", 5, 4, "fake")
    voted = _ballots(CUT, CUT, seven, CUT, CUT)
    assert voted.truncated == 2 and not voted.is_cut and not voted.stop_if_cut()
    again = _ballots(seven, CUT, CUT, CUT)
    assert again.is_cut and again.stop_if_cut()
    abstained = Sample("so it is none", "stop", 5, 4, "fake")
    assert not _ballots(CUT, CUT, abstained).is_cut
    cut = _ballots(CUT, CUT, CUT, abstained)
    assert cut.is_cut and cut.stop_if_cut() and cut.stopped == "truncated"
    assert not cut.stop_if_cut()  # stopped once
    votes = VoteState(1)
    for _ in range(4):
        votes.add(0, None)
    event = cut.answer_event(votes, 0, index=0, id="q", settled_early=False, partial=False)
    # The reply shows why it stopped: a cut completion, not the last abstention.
    assert event.answer is None and event.stopped == "truncated" and event.samples == 4
    assert event.abstained == "so it is" and event.abstained_finish_reason == "length"


class _Straggly(FakeEngine):
    """Unanimous questions ``q0``, ``q1``, ...; requests numbered as ``stalls`` says never
    return unless cancelled. Counts the most requests it held at once."""

    def __init__(self, questions: int, stalls: Callable[[int], bool], latency: float = 0.0):
        super().__init__({f"q{i}": [("42", 1.0)] for i in range(questions)}, latency=latency)
        self._stalls = stalls
        self._asked = 0
        self.most_in_flight = 0

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        self._asked += 1
        self.stall = self._stalls(self._asked)
        self.most_in_flight = max(self.most_in_flight, self.in_flight + 1)
        return await super().generate(request)


def _unanimous(questions: int, budget: int, **kwargs: Any) -> JobSpec:
    return JobSpec([Question(f"q{i}", "p") for i in range(questions)], budget, **kwargs)


def test_a_job_of_unknown_capacity_does_not_wait_on_stragglers() -> None:
    """Every fifth sample never returns: held at its five slots (0.25 in flight for each of
    20 open questions), the job would wait for ever; past its peers' times they stop
    holding slots, and every question settles while they are still out."""
    engine = _Straggly(20, lambda n: n % 5 == 0)
    assert engine.load().capacity is None
    job = Job(_unanimous(20, 320), engine, last_word, stragglers=Stragglers(floor=0.01))
    events = run_coroutine(_events(job))
    answers = [e for e in events if isinstance(e, AnswerEvent)]
    assert sorted(a.index for a in answers) == list(range(20))
    assert all(a.answer == "42" and a.settled_early and not a.partial for a in answers)
    done = events[-1]
    assert done.status is JobStatus.COMPLETED
    # More stragglers were out at once than the job has slots, cut once their questions
    # settled; none of them voted.
    assert engine.most_in_flight > 5 and engine.cancelled > 5 and engine.in_flight == 0
    assert done.spent == len(engine.served)


@pytest.mark.parametrize(("capacity", "most"), [(None, 64), (64, 5)])
def test_samples_stop_holding_slots_only_where_the_capacity_is_unknown(
    capacity: int | None, most: int
) -> None:
    """Every sample out longer than the shortest counts as a straggler: with no known
    capacity the job then takes up to ``concurrency``; with one, its limit stays."""
    engine = _Straggly(20, lambda n: False, latency=0.01)
    engine.capacity = capacity
    spec = _unanimous(20, 320, max_rounds=0)  # sample by sample either way
    eager = Stragglers(multiple=1e-9, floor=0.0, min_peers=1)
    events = run_coroutine(_events(Job(spec, engine, last_word, stragglers=eager)))
    assert events[-1].status is JobStatus.COMPLETED
    assert (engine.most_in_flight > 5) is (capacity is None)
    assert engine.most_in_flight <= most


def test_every_sample_the_engine_returns_has_its_tokens_counted_even_past_its_questions_end() -> (
    None
):
    # Tokens are counted as the engine hands samples over, not as they vote: a sample
    # that comes once its question settled, or its job ended, was made all the same.
    engine = FakeEngine({"sure": [("yes", 1.0)], "split": [("a", 0.5), ("b", 0.5)]})
    questions = [Question("sure", "p"), Question("split", "p")]
    spec = JobSpec(
        questions, budget=40, concurrency=8, in_flight_per_question=4,
        max_samples_per_request=4, settle_delta=0.6,
    )  # fmt: skip
    sink = RecordingStats()
    events = run_coroutine(_events(Job(spec, engine, last_word, sink)))
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.settled == 1
    counted = [args for name, args in sink.calls if name == "tokens"]
    assert len(counted) == len(engine.served)
    assert sum(completion for _, completion in counted) == 4 * len(engine.served)
