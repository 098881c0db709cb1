"""How a job spends its budget with samples in flight: coverage first, then the ranking."""

import random
import statistics
from collections.abc import AsyncIterator
from typing import Any

from blendserve.core import PolicySpec
from blendserve.engines.base import GenerateRequest, Sample, SamplingParams
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.scheduler import AnswerEvent, DoneEvent, Job, JobSpec, Question
from blendserve.sim import run_virtual
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fake_engine import SeedRecordingEngine, last_word

LATENCIES = {
    "zero": LatencyModel(),
    "exponential": LatencyModel(exponential_mean=0.2),
    "gpu-like": LatencyModel(fixed=0.05, exponential_mean=0.1, max_concurrent_sequences=8),
}


class CoverageCheckingEngine(ReplayEngine):
    """Replay engine that checks, at every request, that no question got a second
    sample while another question had none yet."""

    job: Job | None = None
    violations = 0

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        assert self.job is not None
        assigned = self.job.policy.num_assigned
        if max(assigned) >= 2 and min(assigned) == 0:
            self.violations += 1
        async for sample in super().replay_stream(request, kind):
            yield sample


def _records(num_questions: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {"id": f"q{i}", "answers": [rng.choice("abc") for _ in range(rng.randint(1, 6))]}
        for i in range(num_questions)
    ]


def _run(job: Job) -> list[Any]:
    async def events() -> list[Any]:
        return [event async for event in job.events()]

    return run_virtual(events())[0]


@settings(max_examples=60, deadline=None)
@given(
    num_questions=st.integers(1, 64),
    extra=st.integers(0, 200),
    concurrency=st.integers(1, 512),
    latency=st.sampled_from(sorted(LATENCIES)),
    seed=st.integers(0, 3),
)
def test_every_question_is_sampled_before_any_twice_and_every_one_is_answered(
    num_questions: int, extra: int, concurrency: int, latency: str, seed: int
) -> None:
    records = _records(num_questions, seed)
    engine = CoverageCheckingEngine(
        records, seed=seed, latency=LATENCIES[latency], answer_kind="exact"
    )
    questions = [Question(id=r["id"], prompt=r["id"]) for r in records]
    budget = num_questions + extra
    # Sample by sample (waves: test_waves.py).
    spec = JobSpec(questions, budget=budget, concurrency=concurrency, max_rounds=0)
    job = engine.job = Job(spec, engine, last_word)
    events = _run(job)
    answers = [e for e in events if isinstance(e, AnswerEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.spent <= budget
    assert engine.violations == 0
    assert sorted(a.index for a in answers) == list(range(num_questions))
    assert all(a.samples >= 1 and a.answer is not None for a in answers)
    assert engine.stats.samples == done.spent == sum(a.samples for a in answers)
    # Budget is left only where every question stopped of its own accord.
    assert done.spent == budget or all(a.settled_early for a in answers)


def test_two_questions_with_one_sample_each_both_get_it() -> None:
    records = [{"id": "a", "answers": ["1"]}, {"id": "b", "answers": ["2"]}]
    questions = [Question("a", "a"), Question("b", "b")]
    spec = JobSpec(questions, budget=2, concurrency=64)
    job = Job(spec, ReplayEngine(records, answer_kind="exact"), last_word)
    answers = [e for e in _run(job) if isinstance(e, AnswerEvent)]
    assert {a.id: (a.answer, a.samples) for a in answers} == {"a": ("1", 1), "b": ("2", 1)}


def _bars_job(seed: int, **spec: Any) -> dict[str, list[int]]:
    """8 questions that always answer 7 and 8 that answer 3 or 5 (60/40), budget 8 each."""
    easy = [{"id": f"easy{i}", "answers": ["7"]} for i in range(8)]
    hard = [{"id": f"hard{i}", "answers": ["3", "3", "3", "5", "5"]} for i in range(8)]
    records = easy + hard
    engine = ReplayEngine(records, seed=seed, latency=LatencyModel(exponential_mean=0.2))
    questions = [Question(r["id"], r["id"]) for r in records]
    job = Job(JobSpec(questions, budget=128, seed=seed, **spec), engine, last_word)
    samples: dict[str, list[int]] = {"easy": [], "hard": []}
    for event in _run(job):
        if isinstance(event, AnswerEvent):
            samples[event.id.rstrip("0123456789")].append(event.samples)
    return samples


def test_a_small_job_at_default_concurrency_gives_the_hard_questions_the_budget() -> None:
    # Uniform allocation gives 8 and 8; the sequential policy several times more
    # to the contested questions. Samples in flight must not undo that.
    for seed in range(3):
        samples = _bars_job(seed)
        easy, hard = statistics.fmean(samples["easy"]), statistics.fmean(samples["hard"])
        assert hard >= 3 * easy, (seed, samples)


def test_sending_everything_at_once_is_the_uniform_allocation_it_guards_against() -> None:
    samples = _bars_job(0, in_flight_per_question=8.0, concurrency=128)
    assert statistics.fmean(samples["hard"]) < 1.5 * statistics.fmean(samples["easy"])


def test_a_single_question_without_stopping_rule_is_sent_at_once() -> None:
    engine = ReplayEngine([{"id": "q", "answers": ["1", "2"]}])
    spec = JobSpec(
        [Question("q", "q")], budget=64, concurrency=16, max_samples_per_request=8,
        policy=PolicySpec("blend"),
    )  # fmt: skip
    _run(Job(spec, engine, last_word))
    assert engine.stats.requests == 8 and engine.stats.samples == 64


def test_a_single_question_is_sent_what_it_needs_before_it_could_stop() -> None:
    # The default stops a question at ASC's P[p1 < p2] <= 1e-3: nine votes in a row.
    engine = ReplayEngine([{"id": "q", "answers": ["1"]}])
    spec = JobSpec([Question("q", "q")], budget=64, concurrency=16, max_samples_per_request=8)
    done = _run(Job(spec, engine, last_word))[-1]
    assert engine.stats.requests == 2 and engine.stats.samples == done.spent == 9
    assert done.unspent == 64 - 9


def test_a_seeded_question_never_sends_the_same_seed_twice() -> None:
    records = [{"id": "q", "answers": ["1", "2"]}, {"id": "r", "answers": ["3"]}]
    engine = SeedRecordingEngine(records)
    questions = [Question("q", "q"), Question("r", "r")]
    spec = JobSpec(questions, budget=40, concurrency=8, sampling=SamplingParams(seed=1234))
    _run(Job(spec, engine, last_word))
    for seeds in engine.seeds.values():
        assert sorted(seeds) == list(range(1234, 1234 + len(seeds)))
    assert sum(map(len, engine.seeds.values())) == 40
