"""Jobs and pools hand each question's samples to their log once, as they voted; their
engine requests ask for confidence where the spec says."""

import asyncio
from collections import Counter
from collections.abc import Sequence

from blendserve.answers import extract
from blendserve.core.policies import PolicySpec
from blendserve.core.signals import ConfidenceSpec
from blendserve.scheduler import AnswerEvent, Job, JobSpec, ProgressEvent, Question
from blendserve.scheduler.ballots import SeenSample
from blendserve.scheduler.pool import Pool, PoolSpec

from tests.support.fake_engine import FakeSignalEngine, ScriptedSample
from tests.support.running import run_coroutine

SCRIPTS: dict[str, Sequence[ScriptedSample]] = {
    "easy": [("42", 30, 2.5), ("42", 41, 2.0), ("41", 55, 0.75)],
    "split": [("7", 12, 1.5), (None, 64, 0.25), ("8", 20, 1.0), ("7", 33, 1.75)],
    "third": [("3", 9, 3.0)],
}
SPEC = ConfidenceSpec(20).scaled(64)


class FakeSampleLog:
    """A sample log that keeps what it is handed, in order."""

    def __init__(self) -> None:
        self.handed: list[tuple[Question, list[SeenSample]]] = []

    def question_done(self, question: Question, samples: Sequence[SeenSample]) -> None:
        self.handed.append((question, list(samples)))

    def by_id(self) -> dict[str, list[SeenSample]]:
        ids = [q.id for q, _ in self.handed]
        assert len(ids) == len(set(ids)), f"a question handed over twice: {ids}"
        return {q.id: samples for q, samples in self.handed}


async def _number(text: str) -> tuple[str | None, str | None]:
    answer = extract(text, "number")
    return answer, answer


def _check_seen(engine: FakeSignalEngine, event: AnswerEvent, seen: list[SeenSample]) -> None:
    """The samples handed over are those the answer counted, each one the engine served."""
    assert len(seen) == event.samples == event.usage.samples
    assert sum(s.completion_tokens for s in seen) == event.usage.completion_tokens
    voted = Counter(s.key for s in seen if s.key is not None)
    assert voted == Counter(event.votes)
    served = [(a, t, c) for q, a, t, c in engine.served]
    for sample in seen:
        assert sample.finish_reason == "stop" and sample.confidence is not None
        assert (sample.key, sample.completion_tokens, sample.confidence) in served
        assert sample.confidence.window == SPEC.window


def test_a_job_hands_each_answered_question_its_samples_and_asks_for_confidence() -> None:
    engine = FakeSignalEngine(SCRIPTS)
    log = FakeSampleLog()
    questions = [Question(qid, prompt=f"{qid}?") for qid in SCRIPTS]
    spec = JobSpec(questions, budget=24, policy=PolicySpec("sc"), confidence=SPEC)

    async def run() -> list[AnswerEvent]:
        job = Job(spec, engine, _number, log=log)
        return [e async for e in job.events() if isinstance(e, AnswerEvent)]

    events = run_coroutine(run())
    handed = log.by_id()
    assert set(handed) == set(SCRIPTS)
    for event in events:
        _check_seen(engine, event, handed[event.id])
    assert sum(map(len, handed.values())) == len(engine.served) == 24
    assert engine.requests and all(r.confidence == SPEC for r in engine.requests)
    assert [s.key for s in handed["split"]][:2] == ["7", None]  # in order, abstentions kept


def test_a_job_without_a_log_keeps_no_samples_and_asks_for_no_confidence() -> None:
    engine = FakeSignalEngine(SCRIPTS)
    spec = JobSpec([Question("easy", prompt="easy?")], budget=4)

    async def run() -> None:
        job = Job(spec, engine, _number)
        async for event in job.events():
            if isinstance(event, AnswerEvent):
                assert event.samples == 4
        assert not job._states

    run_coroutine(run())
    assert all(r.confidence is None for r in engine.requests)
    assert all(c is None for _, _, _, c in engine.served)


def test_a_job_closed_early_hands_over_the_questions_it_never_answered() -> None:
    # "split" serves one sample, then its requests hang: it is never answered.
    engine = FakeSignalEngine(SCRIPTS, hang_after={"split": 1})
    log = FakeSampleLog()
    questions = [Question("easy", prompt="easy?"), Question("split", prompt="split?")]
    spec = JobSpec(
        questions, budget=8, policy=PolicySpec("sc"), in_flight_per_question=4,
        max_samples_per_request=1, progress_interval=0, confidence=SPEC,
    )  # fmt: skip

    async def run() -> AnswerEvent:
        job = Job(spec, engine, _number, log=log)
        events = job.events()
        answered = None
        async for event in events:
            if isinstance(event, AnswerEvent):
                answered = event
            elif (
                answered
                and isinstance(event, ProgressEvent)
                and event.completed == answered.samples + 1  # split's one sample came
            ):
                break
        await events.aclose()  # the client went away
        assert answered is not None
        return answered

    easy = run_coroutine(run())
    assert easy.id == "easy"
    handed = log.by_id()
    _check_seen(engine, easy, handed["easy"])
    assert [(s.key, s.completion_tokens) for s in handed["split"]] == [("7", 12)]
    assert engine.cancelled >= 1  # its hanging requests were cancelled


def test_a_pool_hands_each_question_its_samples_once_it_ends() -> None:
    engine = FakeSignalEngine(SCRIPTS)
    log = FakeSampleLog()
    pool = Pool(PoolSpec(budget_per_question=6, confidence=SPEC), engine, _number, log=log)

    async def run() -> list[AnswerEvent]:
        tasks = [pool.submit(Question(qid, prompt=f"{qid}?")) for qid in SCRIPTS]
        return list(await asyncio.gather(*tasks))

    events = run_coroutine(run())
    handed = log.by_id()
    assert set(handed) == set(SCRIPTS)
    for event in events:
        _check_seen(engine, event, handed[event.id])
    assert sum(map(len, handed.values())) == len(engine.served)
    assert all(r.confidence == SPEC for r in engine.requests)


def test_a_pool_question_whose_caller_left_hands_over_what_it_took() -> None:
    engine = FakeSignalEngine(SCRIPTS, hang_after={"split": 1})
    log = FakeSampleLog()
    keyed = asyncio.Event()

    async def keyer(text: str) -> tuple[str | None, str | None]:
        keyed.set()
        return await _number(text)

    spec = PoolSpec(budget_per_question=6, max_samples_per_request=1, confidence=SPEC)
    pool = Pool(spec, engine, keyer, log=log)

    async def run() -> None:
        task = pool.submit(Question("split", prompt="split?"))
        await keyed.wait()  # its one sample is counted (the keyer returns at once)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()

    run_coroutine(run())
    assert [(s.key, s.completion_tokens) for s in log.by_id()["split"]] == [("7", 12)]
