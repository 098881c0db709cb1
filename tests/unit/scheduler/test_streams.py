"""Samples handed over as each ends: the replay engine's continuous batch, jobs, pools, merging.

On a continuously batching engine a request's samples end at their own
times; a question settled by its first ones need not wait for (or pay for)
the rest. Modelled time runs on the simulator's virtual clock.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import pytest
from blendserve.answers import extract
from blendserve.core.policies import PolicySpec
from blendserve.engines.base import GenerateRequest, Sample
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.engines.step_cost import StepCost
from blendserve.errors import EngineUnavailable
from blendserve.recordings import RecordedSample
from blendserve.scheduler import AnswerEvent, DoneEvent, Job, JobSpec, Question
from blendserve.scheduler.pool import Pool, PoolSpec
from blendserve.scheduler.streams import merged
from blendserve.sim import run_virtual
from blendserve.stats import NO_STATS

from tests.support.fake_engine import last_word

#: 10 ms a step, whatever the width and context: easy to add up.
FLAT = StepCost(base_ms=10.0, per_sequence_ms=0.0, per_sequence_context_ms=0.0)


class _Lengths(ReplayEngine):
    """Replay engine on :data:`FLAT` whose samples have the lengths given, in turn."""

    def __init__(self, answers: list[str], lengths: list[int]) -> None:
        latency = LatencyModel(step_cost=FLAT, length=(0.0, 0.0))
        super().__init__([{"id": "q", "answers": answers}], latency=latency, answer_kind="exact")
        self.lengths = iter(lengths)

    def _lengths(
        self, drawn: Sequence[RecordedSample], texts: Sequence[tuple[str, str]]
    ) -> list[int]:
        return [next(self.lengths) for _ in texts]


def _request(n: int) -> GenerateRequest:
    return GenerateRequest(prompt="q", n=n, question_id="q")


def test_the_replay_engine_hands_each_sample_over_as_it_ends() -> None:
    engine = _Lengths(["7"], [300, 100, 200])

    async def scenario() -> list[tuple[int, float]]:
        loop = asyncio.get_running_loop()
        return [(s.completion_tokens, loop.time()) async for s in engine.stream(_request(3))]

    ended, _ = run_virtual(scenario())
    assert [tokens for tokens, _ in ended] == [100, 200, 300]
    assert [at for _, at in ended] == pytest.approx([1.0, 2.0, 3.0])


def test_closing_a_stream_frees_the_samples_still_running() -> None:
    engine = _Lengths(["7"], [100, 1000, 1000])

    async def scenario() -> tuple[int, float]:
        stream = engine.stream(_request(3))
        async with contextlib.aclosing(stream):
            first = await anext(stream)
        return first.completion_tokens, asyncio.get_running_loop().time()

    (tokens, ended), elapsed = run_virtual(scenario())
    assert tokens == 100 and ended == pytest.approx(1.0) and elapsed == pytest.approx(1.0)
    assert engine.load().running == 0 and engine.stats.samples == 1


def test_a_job_cuts_a_settled_questions_stragglers_before_they_end() -> None:
    """Four unanimous samples settle the question (PPR 0.31); the two long ones are cut, unpaid."""
    engine = _Lengths(["7"], [10, 20, 30, 40, 5000, 5000])
    spec = JobSpec(
        [Question("q", "q")], budget=6, policy=PolicySpec("hedge"), settle_delta=0.32,
        max_samples_per_request=6, in_flight_per_question=6, concurrency=6,
    )  # fmt: skip

    async def scenario() -> list[object]:
        return [event async for event in Job(spec, engine, last_word).events()]

    events, elapsed = run_virtual(scenario())
    done = events[-1]
    assert isinstance(done, DoneEvent)
    (answer,) = [e for e in events if isinstance(e, AnswerEvent)]
    assert answer.answer == "7" and answer.settled_early
    assert done.cut == 6 - answer.samples > 0
    assert done.usage.completion_tokens < 5000 and elapsed < 5000 * 0.01 / 10
    assert engine.load().running == 0 and engine.sequences_in_flight == 0


async def _keyer(text: str) -> tuple[str | None, str | None]:
    answer = extract(text, "number")
    return answer, answer


def test_a_pool_question_stops_mid_wave_once_its_last_samples_cannot_change_that() -> None:
    """A first wave of five: four unanimous votes stop the question whatever the fifth says,
    so the fifth, a 5,000-token straggler, is cut instead of waited for."""
    engine = _Lengths(["7"], [10, 20, 30, 40, 5000])
    pool = Pool(PoolSpec(budget_per_question=16), engine, _keyer)

    async def ask() -> AnswerEvent:
        return await pool.submit(Question("q", prompt="q"))

    answer, elapsed = run_virtual(ask())
    assert answer.answer == "7" and answer.samples == 4 and answer.settled_early
    assert elapsed == pytest.approx(0.4) and engine.load().running == 0
    assert engine.sequences_in_flight == 0


class _Failing(ReplayEngine):
    """Its requests of two samples fail, after ``delay`` modelled seconds."""

    delay = 0.0

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        if request.n == 2:
            await asyncio.sleep(self.delay)
            raise EngineUnavailable("the second upstream went away")
        async for sample in super().replay_stream(request, kind):
            yield sample


@pytest.mark.parametrize("delay", [0.0, 1.0])
def test_merged_streams_hand_over_what_ended_then_raise_the_first_failure(delay: float) -> None:
    """Whether the failure comes later or with them, the samples that ended are handed over."""
    engine = _Failing([{"id": "q", "answers": ["7"]}], answer_kind="exact")
    engine.delay = delay
    got: list[int] = []

    async def scenario() -> None:
        async for ended in merged(engine, [_request(3), _request(2)], NO_STATS):
            got.append(len(ended))

    with pytest.raises(EngineUnavailable, match="went away"):
        run_virtual(scenario())
    assert sum(got) == 3
