"""Jobs and pools report to the sink they are given, or their engine's; no Prometheus."""

import asyncio
import itertools
import subprocess
import sys
from typing import Any, TypeVar

from blendserve.answers import extract
from blendserve.engines.replay import ReplayEngine
from blendserve.scheduler import AnswerEvent, DoneEvent, Job, JobSpec, JobStatus, Question
from blendserve.scheduler.pool import Pool, PoolSpec
from blendserve.stats import NO_STATS
from blendserve.testing.stats import RecordingStats

from tests.support.fake_engine import FakeEngine, last_word
from tests.support.running import run_coroutine

T = TypeVar("T")

RECORDS = [
    {"id": "a", "prompt": "A?", "answers": ["1"] * 9 + ["2"]},
    {"id": "b", "prompt": "B?", "answers": ["3"] * 10},
    {"id": "c", "prompt": "C?", "answers": ["4", "5"]},
]
QUESTIONS = [Question(str(r["id"]), prompt=str(r["prompt"])) for r in RECORDS]


async def _keyer(text: str) -> tuple[str | None, str | None]:
    answer = extract(text, "number")
    return answer, answer


async def _events(job: Job) -> list[Any]:
    return [event async for event in job.events()]


def test_a_job_reports_its_life_answers_and_tokens_to_its_engines_sink() -> None:
    sink = RecordingStats()
    engine = ReplayEngine(RECORDS, seed=1, sink=sink)
    job = Job(JobSpec(questions=QUESTIONS, budget=24, settle_delta=0.1), engine, _keyer)
    events = run_coroutine(_events(job))
    answers = [e for e in events if isinstance(e, AnswerEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.status is JobStatus.COMPLETED
    assert job.sink is sink
    assert sink.of("job_started") == [(24,)]
    ((status, seconds, spent, unspent),) = sink.of("job_ended")
    assert (status, spent, unspent) == ("completed", done.spent, 24 - done.spent)
    assert 0 <= seconds <= done.duration_s
    assert len(sink.of("first_answer")) == 1
    reported = sink.of("answered")
    assert [(s, early) for s, _, _, early in reported] == [
        (a.samples, a.settled_early) for a in answers
    ]
    assert [share for _, share, _, _ in reported] == [a.confidence.share for a in answers]
    # Every question queued is answered, every sample asked for came back.
    assert sink.level("queued") == 0 and sink.of("queued")[0] == (3,)
    assert sink.level("in_flight") == 0
    assert sum(c for _, c in sink.of("tokens")) == done.usage.completion_tokens
    assert len(sink.of("tokens")) == done.spent
    assert sink.samples("replay") == {"dispatched": done.spent, "completed": done.spent}
    assert not sink.of("pool_answered")


def test_a_job_given_a_sink_reports_there_and_its_engine_where_it_does() -> None:
    engine_sink, job_sink = RecordingStats(), RecordingStats()
    engine = ReplayEngine(RECORDS, seed=1, sink=engine_sink)
    job = Job(JobSpec(questions=QUESTIONS, budget=6), engine, _keyer, sink=job_sink)
    run_coroutine(_events(job))
    assert [name for name, _ in job_sink.calls if name.startswith("upstream")] == []
    assert job_sink.of("job_started") == [(6,)] and not engine_sink.of("job_started")
    assert engine_sink.samples("replay")["completed"] == 6


def test_a_failed_job_ends_with_its_unanswered_questions_unqueued() -> None:
    sink = RecordingStats()
    engine = FakeEngine({"a": [("1", 1.0)]}, fail_next=10**6)
    spec = JobSpec(
        questions=[Question("a", prompt="x")],
        budget=4,
        max_consecutive_failures=2,
        failure_timeout=0,
    )
    events = run_coroutine(_events(Job(spec, engine, last_word, sink=sink)))
    assert events[-1].status is JobStatus.FAILED
    assert sink.of("job_ended")[0][0] == "failed"
    assert sink.level("queued") == 0 and sink.level("in_flight") == 0


def test_a_pool_reports_each_question_its_rounds_and_its_pacing() -> None:
    sink = RecordingStats()
    engine = ReplayEngine(RECORDS, seed=2)
    pool = Pool(PoolSpec(budget_per_question=4), engine, _keyer, "p", sink)

    async def ask() -> list[AnswerEvent]:
        return list(await asyncio.gather(*(pool.submit(q) for q in QUESTIONS)))

    answers = run_coroutine(ask())
    paced = sink.of("pool_answered")
    assert [p[0] for p in paced] == ["p"] * 3
    assert sum(p[1] for p in paced) == pool.num_rounds >= 3
    assert all(tau > 0 for _, _, tau, _, _ in paced)
    assert paced[-1][3:] == (pool.mean_samples, pool.pacing_error)
    assert pool.mean_samples == pool.client().price.mean_samples  # one client: its mean
    assert sorted(s for s, _, _, _ in sink.of("answered")) == sorted(a.samples for a in answers)
    assert sink.level("queued") == 0 and sink.level("in_flight") == 0
    levels = list(itertools.accumulate(n for (n,) in sink.of("in_flight")))
    assert 0 < max(levels) <= pool.spec.concurrency and min(levels) >= 0
    assert len(sink.of("tokens")) == sum(a.samples for a in answers)
    assert not sink.of("job_started") and not sink.of("upstream_samples")  # engine: no sink


def test_without_a_sink_nothing_is_reported_and_no_prometheus_is_loaded() -> None:
    engine = FakeEngine({"a": [("1", 1.0)]})
    assert engine.sink is NO_STATS
    job = Job(JobSpec(questions=[Question("a", prompt="x")], budget=2), engine, last_word)
    assert job.sink is NO_STATS and run_coroutine(_events(job))[-1].status is JobStatus.COMPLETED
    # A fresh interpreter, so that other tests' imports do not count.
    code = (
        "import sys, blendserve.scheduler, blendserve.engines.replay, blendserve.engines.openai; "
        "print(' '.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "prometheus_client" not in loaded and "blendserve.service.metrics" not in loaded
