"""A job on an engine with room goes in a few waves; on a busy one, sample by sample."""

import asyncio
import math
import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from blendserve.core.waves import WIDE_MAX_ROUNDS
from blendserve.engines.base import EngineLoad, GenerateRequest, Sample
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.scheduler import AnswerEvent, DoneEvent, Job, JobSpec, Question
from blendserve.sim import run_virtual
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fake_engine import last_word


class WaveEngine(ReplayEngine):
    """Replay engine with the wave latency model, recording when each question's requests start."""

    def __init__(self, records: list[dict[str, Any]], capacity: int, seed: int = 0) -> None:
        latency = LatencyModel(fixed=1.0, max_concurrent_sequences=capacity)
        super().__init__(records, seed=seed, latency=latency, answer_kind="exact")
        self.starts: dict[str, set[float]] = {}
        self.first_wave_violations = 0
        self.job: Job | None = None

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        now = asyncio.get_running_loop().time()
        starts = self.starts.setdefault(str(request.question_id), set())
        later = starts and now not in starts
        if later and self.job is not None and min(self.job.policy.num_assigned) == 0:
            self.first_wave_violations += 1  # a second wave before every first one
        starts.add(now)
        async for sample in super().replay_stream(request, kind):
            yield sample


def _records(num_questions: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {"id": f"q{i}", "answers": [rng.choice("aab" if i % 3 else "abc") for _ in range(8)]}
        for i in range(num_questions)
    ]


def _run(job: Job) -> tuple[list[Any], float]:
    async def events() -> list[Any]:
        return [event async for event in job.events()]

    return run_virtual(events())


@settings(max_examples=100, deadline=None)
@given(
    num_questions=st.integers(1, 48),
    per_question=st.integers(1, 24),
    capacity=st.sampled_from([64, 256, 4096]),
    max_rounds=st.integers(1, 5),
    seed=st.integers(0, 3),
    concurrency=st.none() | st.integers(1, 96),
)
def test_a_lone_job_takes_at_most_max_rounds_waves_per_question_and_accounts_every_sample(
    num_questions: int,
    per_question: int,
    capacity: int,
    max_rounds: int,
    seed: int,
    concurrency: int | None,
) -> None:
    records = _records(num_questions, seed)
    engine = WaveEngine(records, capacity, seed)
    questions = [Question(id=r["id"], prompt=r["id"]) for r in records]
    budget = num_questions * per_question
    spec = JobSpec(
        questions, budget=budget, max_rounds=max_rounds, seed=seed, concurrency=concurrency
    )
    job = engine.job = Job(spec, engine, last_word)
    events, _ = _run(job)
    answers = [e for e in events if isinstance(e, AnswerEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.spent <= budget
    assert sorted(a.index for a in answers) == list(range(num_questions))
    assert engine.stats.samples == done.spent == sum(a.samples for a in answers)
    assert engine.first_wave_violations == 0
    assert engine.sequences_in_flight == 0
    if concurrency is None:
        assert max(len(s) for s in engine.starts.values()) <= max_rounds
    else:  # the bound first: past it, rounds are what the samples take
        assert engine.stats.max_sequences_in_flight <= concurrency


def test_a_job_given_a_concurrency_keeps_its_waves_within_it() -> None:
    records = _records(64, seed=3)
    questions = [Question(id=r["id"], prompt=r["id"]) for r in records]
    widest = {}
    for concurrency in (None, 16):
        engine = WaveEngine(records, capacity=1024)
        spec = JobSpec(questions, budget=64 * 10, max_rounds=4, concurrency=concurrency)
        events, _ = _run(Job(spec, engine, last_word))
        assert isinstance(events[-1], DoneEvent) and events[-1].spent > 64
        widest[concurrency] = engine.stats.max_sequences_in_flight
    assert widest[16] == 16 and widest[None] > 64  # unbounded: as wide as the engine has room


def test_on_an_idle_engine_a_job_ends_in_a_few_waves_where_sample_by_sample_takes_many() -> None:
    records = _records(64, seed=1)
    questions = [Question(id=r["id"], prompt=r["id"]) for r in records]
    wall = {}
    for rounds in (4, 0):
        engine = WaveEngine(records, capacity=1024)
        job = Job(JobSpec(questions, budget=64 * 10, max_rounds=rounds), engine, last_word)
        events, wall[rounds] = _run(job)
        assert isinstance(events[-1], DoneEvent) and events[-1].spent > 64
    assert wall[4] <= 4.0 + 1e-9
    assert wall[0] >= 3 * wall[4]


@pytest.mark.parametrize("delivers_each", [True, False])
def test_an_engine_with_room_for_half_the_job_gets_a_round_fewer_if_it_delivers_each_sample(
    delivers_each: bool,
) -> None:
    """Where the engine hands each sample over as it ends; where a request's samples come
    together (as the wave model's do), the job keeps the plan's rounds whatever the room."""
    records = _records(64, seed=4)
    questions = [Question(id=r["id"], prompt=r["id"]) for r in records]
    rounds = {}
    # 64 questions at 12 a question: 768 samples, half of them fit in 512 slots, not in 256.
    for capacity in (512, 256):
        engine = WaveEngine(records, capacity)
        assert not engine.delivers_each and not engine.rendering("exact").delivers_each
        engine.delivers_each = delivers_each  # what the job decides by
        events, _ = _run(Job(JobSpec(questions, budget=64 * 12, max_rounds=4), engine, last_word))
        assert isinstance(events[-1], DoneEvent) and events[-1].spent > 64 * 11
        rounds[capacity] = max(len(s) for s in engine.starts.values())
    if delivers_each:
        assert rounds[512] <= WIDE_MAX_ROUNDS < rounds[256] == 4
    else:
        assert rounds[512] == rounds[256] == 4


def test_a_busy_engine_keeps_the_job_sample_by_sample() -> None:
    """With no room beyond the job's own in-flight limit, no wave of the plan is sent."""
    records = _records(64, seed=2)
    questions = [Question(id=r["id"], prompt=r["id"]) for r in records]
    engine = WaveEngine(records, capacity=8)
    job = Job(JobSpec(questions, budget=64 * 6, max_rounds=4), engine, last_word)
    _run(job)
    sizes = Counter(len(s) for s in engine.starts.values())
    assert max(sizes) > 4  # rounds are not bounded: samples, not waves, bound the job
    assert engine.stats.max_sequences_in_flight <= 8


class _TenantEngine(WaveEngine):
    """A wave engine that reports ``others`` sequences of another tenant running on it."""

    def __init__(self, records: list[dict[str, Any]], capacity: int, others: int) -> None:
        super().__init__(records, capacity)
        self.others = others

    def load(self) -> EngineLoad:
        load = super().load()
        return EngineLoad(load.capacity, load.running + self.others, load.waiting)


@pytest.mark.parametrize("others", [127, 128])
def test_an_engine_others_hold_half_of_keeps_the_job_sample_by_sample_in_its_free_slots(
    others: int,
) -> None:
    """Waves while others hold less than half the engine; from half on, sample by sample,
    filling the slots left free beyond the job's own in-flight limit."""
    records = _records(64, seed=4)
    questions = [Question(id=r["id"], prompt=r["id"]) for r in records]
    engine = _TenantEngine(records, capacity=256, others=others)
    job = Job(JobSpec(questions, budget=64 * 12, max_rounds=4), engine, last_word)
    events, _ = _run(job)
    assert isinstance(events[-1], DoneEvent) and events[-1].spent > 64 * 4
    rounds = max(len(s) for s in engine.starts.values())
    if others < 128:
        assert rounds <= 4
    else:
        assert rounds > 4
        limit = math.ceil(job.spec.in_flight_per_question * 64)
        assert limit < engine.stats.max_sequences_in_flight <= 256 - others


class _OverlapEngine(ReplayEngine):
    """Replay engine counting the requests that start while an earlier wave of their question
    (one that started at another time) is still out."""

    def __init__(self, records: list[dict[str, Any]], latency: LatencyModel) -> None:
        super().__init__(records, seed=3, latency=latency, answer_kind="exact")
        self.out: Counter[str] = Counter()
        self.started: dict[str, float] = {}
        self.overlaps = 0

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        q, now = str(request.question_id), asyncio.get_running_loop().time()
        self.overlaps += bool(self.out[q]) and self.started[q] != now
        self.started[q] = now
        self.out[q] += 1
        try:
            async for sample in super().replay_stream(request, kind):
                yield sample
        finally:
            self.out[q] -= 1


def test_a_question_is_planned_once_its_last_wave_is_back_and_others_do_not_wait() -> None:
    """Answers that come back spread out (as a real engine's long and short samples do) are not
    planned on in part: a question's next wave waits for every vote of its last one, but not
    for the other questions' stragglers."""
    records = _records(400, seed=3)
    questions = [Question(id=r["id"], prompt=r["id"]) for r in records]
    latency = LatencyModel(fixed=0.5, exponential_mean=0.5, max_concurrent_sequences=100_000)
    engine = _OverlapEngine(records, latency)
    job = Job(JobSpec(questions, budget=400 * 8, max_rounds=4), engine, last_word)
    in_flight_at_plans = []
    planned = job.policy.plan_waves

    def counted(*args: Any) -> dict[int, int]:
        in_flight_at_plans.append(job.policy.num_pending)
        return planned(*args)

    job.policy.plan_waves = counted  # type: ignore[method-assign]
    events, _ = _run(job)
    assert isinstance(events[-1], DoneEvent) and events[-1].spent > 400
    assert engine.overlaps == 0 and engine.stats.requests > 800
    # Plans were made while other questions' samples were out: no barrier for the job.
    assert sum(n > 0 for n in in_flight_at_plans) > 10


def test_a_job_makes_the_same_choices_every_run() -> None:
    """Requests that come back together are taken in the order they were sent: the choices
    (and so every benchmark on the virtual clock) do not depend on where tasks sit in memory."""
    records = _records(64, seed=3)
    questions = [Question(id=r["id"], prompt=r["id"]) for r in records]

    def samples_per_question() -> list[int]:
        engine = WaveEngine(records, capacity=8, seed=1)
        events, _ = _run(Job(JobSpec(questions, budget=64 * 6, seed=1), engine, last_word))
        answers = sorted((e for e in events if isinstance(e, AnswerEvent)), key=lambda e: e.index)
        return [e.samples for e in answers]

    first = samples_per_question()
    assert all(samples_per_question() == first for _ in range(5))
