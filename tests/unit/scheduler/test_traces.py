"""Trace rules in jobs and pools: weighted votes, the cut bar, first_m, and why samples stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from blendserve.core.signals import Confidence, ConfidenceSpec
from blendserve.core.traces import LOW_CONFIDENCE, STOPS, TraceFacts, TraceLearner, parse_trace_rule
from blendserve.engines.base import Engine, EngineHealth, GenerateRequest, Sample
from blendserve.scheduler import AnswerEvent, DoneEvent, Job, JobSpec, Question
from blendserve.scheduler.pool import Pool, PoolSpec
from blendserve.scheduler.traces import TraceLearners
from blendserve.testing.stats import RecordingStats

from tests.support.fake_engine import last_word
from tests.support.running import run_coroutine

#: A confident right answer, and an unconfident wrong one (answer, tokens, mean confidence).
SURE, UNSURE = ("a", 100, 0.9), ("b", 100, 0.1)
SPEC = ConfidenceSpec(20).scaled(400)


class StopsStats(RecordingStats):
    """Records ``samples_stopped`` reports too."""

    def samples_stopped(self, stops: Mapping[str, int], cut_tokens: int) -> None:
        self.calls.append(("samples_stopped", (dict(stops), cut_tokens)))


def _confidence(mean: float, tokens: int, window: int) -> Confidence:
    return Confidence(
        mean, mean - 0.5, mean + 0.25, tokens, window, max(1, tokens // 2), (mean - 0.5, mean + 0.5)
    )


class FakeTraceEngine(Engine):
    """A fake engine: each question serves its script in turn (cycling), by the order its
    samples were asked for. A sample whose ordinal is in ``hang`` hangs until cancelled;
    a request with ``cut_below`` has a sample whose lowest group is below it handed over
    cut (finish ``low_confidence``, half its tokens), as an engine that honours it would."""

    name = "fake-traces"

    def __init__(
        self,
        scripts: Mapping[str, Sequence[tuple[str, int, float]]],
        hang: Mapping[str, set[int]] | None = None,
    ) -> None:
        self.scripts = scripts
        self.hang = hang or {}
        self.requests: list[GenerateRequest] = []
        self.cancelled = 0
        self._asked: dict[str, int] = {}

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        self.requests.append(request)
        assert request.question_id is not None
        question = request.question_id.rsplit(":", 1)[-1]
        first = self._asked.get(question, 0)
        self._asked[question] = first + request.n
        try:
            await asyncio.sleep(0)  # a real engine always yields to the loop
            samples = []
            for ordinal in range(first, first + request.n):
                if ordinal in self.hang.get(question, set()):
                    await asyncio.Event().wait()
                script = self.scripts[question]
                answer, tokens, mean = script[ordinal % len(script)]
                confidence = None
                if request.confidence is not None:
                    confidence = _confidence(mean, tokens, request.confidence.window)
                finish = "stop"
                bar = request.cut_below
                if bar is not None and confidence is not None and confidence.lowest_group < bar:
                    finish, tokens = LOW_CONFIDENCE, tokens // 2
                text = f"so it is {answer}" if finish == "stop" else "so it is"
                samples.append(Sample(text, finish, 7, tokens, self.name, confidence=confidence))
            return samples
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def health(self) -> EngineHealth:
        return EngineHealth(True, {self.name: True})


def trained(learner: TraceLearner | None = None) -> TraceLearner:
    """A learner (``learner``, else a new one) whose traffic showed that confident samples
    agree: sure ones agreed, unsure ones did not (mean, tail and the lowest group all tell
    them apart; length does not)."""
    learner = learner if learner is not None else TraceLearner()
    for _ in range(8):
        sure = [TraceFacts(100, _confidence(0.9, 100, 64), True)] * 8
        unsure = [TraceFacts(100, _confidence(0.1, 100, 64), False)] * 8
        learner.learn(sure + unsure)
    return learner


def _job(
    rule: str,
    engine: Engine,
    budget: int,
    learner: TraceLearner | None = None,
    sink: RecordingStats | None = None,
    **spec: Any,
) -> list[Any]:
    job_spec = JobSpec(
        questions=[Question("q", prompt="which?")],
        budget=budget,
        confidence=SPEC,
        traces=parse_trace_rule(rule),
        **spec,
    )
    job = Job(job_spec, engine, last_word, sink, learner=learner)

    async def run() -> list[Any]:
        return [event async for event in job.events()]

    return run_coroutine(run())


def _answer(events: list[Any]) -> AnswerEvent:
    (answer,) = [e for e in events if isinstance(e, AnswerEvent)]
    return answer


def test_count_votes_whole_and_says_every_sample_finished() -> None:
    engine = FakeTraceEngine({"q": [SURE, UNSURE, UNSURE]})
    events = _job("count", engine, 6)
    answer = _answer(events)
    assert answer.key == "b" and answer.votes == {"a": 2, "b": 4}
    assert all(isinstance(v, int) for v in answer.votes.values())
    assert answer.stops == {**dict.fromkeys(STOPS, 0), "finished": 6}
    assert answer.cut_tokens == 0
    assert all(r.cut_below is None for r in engine.requests)


def test_weighted_votes_count_what_the_learner_weighs_them() -> None:
    engine = FakeTraceEngine({"q": [SURE, UNSURE, UNSURE]})
    answer = _answer(_job("weighted:measure=mean", engine, 6, trained()))
    # Confident votes count whole; the least confident trace counts 1 - strength (the floor).
    assert answer.key == "a"
    assert answer.votes["a"] == pytest.approx(2.0) and answer.votes["b"] == pytest.approx(0.04)
    assert answer.stops["finished"] == answer.samples == 6


def test_a_filter_answers_with_the_most_confident_share_of_the_question() -> None:
    engine = FakeTraceEngine({"q": [SURE, UNSURE, UNSURE]})
    answer = _answer(_job("filter:measure=mean,keep=0.3", engine, 6, trained()))
    assert answer.key == "a"  # the surest third of its 6 samples: both "a"
    untrained = _answer(_job("filter:measure=mean,keep=0.3", engine, 6, TraceLearner()))
    assert untrained.key == "b" and untrained.votes == {"a": 2, "b": 4}


def test_the_learner_is_taught_by_the_plain_plurality_not_by_the_rule_s_answer() -> None:
    # A filter answers "a" by confidence; had it taught that "a" agreed, confidence would
    # look like agreement whatever it meant (a loop that feeds itself).
    taught = TraceLearner()
    learned: list[list[TraceFacts]] = []
    taught.learn = learned.append  # type: ignore[method-assign]
    for attribute, value in vars(trained()).items():
        setattr(taught, attribute, value)
    engine = FakeTraceEngine({"q": [SURE, UNSURE, UNSURE]})
    answer = _answer(_job("filter:measure=mean,keep=0.3", engine, 6, taught))
    assert answer.key == "a"
    (facts,) = learned
    assert [f.agreed for f in facts] == [f.confidence.mean < 0.5 for f in facts if f.confidence]


def test_a_measure_with_no_signal_changes_nothing() -> None:
    engine = FakeTraceEngine({"q": [SURE, UNSURE, UNSURE]})
    answer = _answer(_job("weighted:measure=mean", engine, 6, TraceLearner()))
    assert answer.key == "b" and answer.votes == {"a": 2, "b": 4}


def test_a_cut_sample_abstains_and_is_counted_as_cut_not_truncated() -> None:
    engine = FakeTraceEngine({"q": [SURE, UNSURE, UNSURE]})
    sink = StopsStats()
    answer = _answer(_job("count:cut=50", engine, 6, trained(), sink))
    # The 50th percentile of the lowest groups the learner saw.
    assert all(r.cut_below == pytest.approx(0.4) for r in engine.requests)
    assert answer.key == "a" and answer.votes == {"a": 2}
    assert answer.stops["low_confidence"] == 4 and answer.stops["finished"] == 2
    assert answer.cut_tokens == 4 * 50
    assert answer.stopped is None  # cut for low confidence is not truncated at max_tokens
    assert sink.of("samples_stopped") == [(answer.stops, 200)]


def test_no_bar_is_sent_until_the_lowest_group_shows_a_signal() -> None:
    engine = FakeTraceEngine({"q": [SURE, UNSURE, UNSURE]})
    answer = _answer(_job("count:cut=50", engine, 6, TraceLearner()))
    assert all(r.cut_below is None for r in engine.requests)
    assert answer.stops["low_confidence"] == 0 and answer.key == "b"


def test_a_job_that_cuts_needs_a_confidence_spec() -> None:
    spec = JobSpec(
        questions=[Question("q", prompt="which?")], budget=2, traces=parse_trace_rule("count:cut=5")
    )
    with pytest.raises(ValueError, match="confidence"):
        Job(spec, FakeTraceEngine({"q": [SURE]}), last_word)


def _short_agree() -> TraceLearner:
    """A learner whose traffic showed that short samples agree and long ones do not."""
    learner = TraceLearner()
    for _ in range(16):
        short = [TraceFacts(100, None, True)] * 8
        long = [TraceFacts(400, None, False)] * 8
        learner.learn(short + long)
    return learner


def test_first_m_cancels_the_rest_of_a_wave_and_the_question_goes_on() -> None:
    # One wave of 4 requests of one sample: the 3rd and 4th hang until cancelled.
    engine = FakeTraceEngine({"q": [SURE]}, hang={"q": {2, 3}})
    events = _job(
        "count:first_m=2", engine, 4, _short_agree(), concurrency=4, max_samples_per_request=1
    )
    answer, done = _answer(events), events[-1]
    assert isinstance(done, DoneEvent) and done.spent == 4
    assert [r.n for r in engine.requests[:4]] == [1, 1, 1, 1]
    assert engine.cancelled == 2
    # Refunded and sent again: the question still took its whole budget.
    assert answer.samples == 4 and answer.votes == {"a": 4}
    assert answer.stops["first_m"] == 2 and answer.stops["finished"] == 4


def test_first_m_cuts_no_wave_before_length_has_told() -> None:
    engine = FakeTraceEngine({"q": [SURE]})
    events = _job("count:first_m=2", engine, 4, concurrency=4, max_samples_per_request=1)
    answer = _answer(events)
    assert engine.cancelled == 0
    assert answer.stops["first_m"] == 0 and answer.stops["finished"] == 4


def test_samples_cancelled_because_the_question_settled_are_counted_so() -> None:
    # Five unanimous votes settle it at settle_delta=0.2; the samples after them hang.
    engine = FakeTraceEngine({"q": [SURE]}, hang={"q": set(range(5, 64))})
    events = _job("count", engine, 8, settle_delta=0.2, concurrency=8, max_samples_per_request=1)
    answer, done = _answer(events), events[-1]
    assert isinstance(done, DoneEvent)
    assert answer.stops["settled"] == done.cut > 0
    assert answer.stops["finished"] == answer.samples


def _pool(rule: str, engine: Engine, learners: TraceLearners, client: str) -> AnswerEvent:
    spec = PoolSpec(
        budget_per_question=None,
        target=0.05,
        max_cap=6,
        confidence=SPEC,
        traces=parse_trace_rule(rule),
        max_samples_per_request=1,
    )
    pool = Pool(spec, engine, last_word, learner_of=lambda name: learners.get(name, "m"))

    async def run() -> AnswerEvent:
        try:
            return await pool.submit(Question("q", prompt="which?"), client)
        finally:
            await pool.aclose()

    return run_coroutine(run())


def test_a_pool_weighs_and_cuts_with_its_clients_learner() -> None:
    learners = TraceLearners()
    trained(learners.get("alice", "m"))
    engine = FakeTraceEngine({"q": [SURE, UNSURE, UNSURE]})
    answer = _pool("weighted:measure=mean,cut=50", engine, learners, "alice")
    assert answer.key == "a" and set(answer.votes) == {"a"}
    assert answer.stops["low_confidence"] == answer.samples - answer.votes["a"]
    assert answer.cut_tokens == 50 * answer.stops["low_confidence"]
    # Another client learned nothing: no bar, whole votes.
    engine = FakeTraceEngine({"q": [SURE, UNSURE, UNSURE]})
    other = _pool("weighted:measure=mean,cut=50", engine, learners, "bob")
    assert all(r.cut_below is None for r in engine.requests)
    assert other.stops["low_confidence"] == 0 and other.stops["finished"] == other.samples


def test_learners_are_kept_per_client_and_model_and_bounded() -> None:
    learners = TraceLearners(max_learners=2)
    alice = learners.get("alice", "m")
    assert learners.get("alice", "m") is alice
    assert learners.get("alice", "other") is not alice
    assert learners.get("bob", "m") is not alice
    assert len(learners) == 2 and learners.get("alice", "m") is not alice  # forgotten
