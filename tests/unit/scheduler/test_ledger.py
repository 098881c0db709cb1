"""One ledger of samples in flight, kept where samples pass (``deliver``), not by each caller.

A request's ``n`` count once it starts, one less as each sample is handed
over, and the rest once it ends, however it ends; the engine counts its own
the same way (``Engine.counted_stream``), and nothing else writes its count.
"""

import asyncio
from collections.abc import AsyncGenerator, Callable

import pytest
from blendserve.core.stragglers import Stragglers
from blendserve.engines.base import Engine, EngineHealth, GenerateRequest, Sample
from blendserve.errors import EngineUnavailable
from blendserve.scheduler import AnswerEvent, DoneEvent, Job, JobSpec, JobStatus, Question
from blendserve.scheduler.streams import deliver
from blendserve.testing.stats import RecordingStats

from tests.support.fake_engine import FakeEngine, last_word
from tests.support.running import run_coroutine

SAMPLE = Sample("so it is 7", "stop", 5, 4, "scripted")


class _Scripted(Engine):
    """Hands over what the test puts in ``feed``: a sample, an error to raise, or None to end."""

    delivers_each = True

    def __init__(self) -> None:
        self.feed: asyncio.Queue[Sample | Exception | None] = asyncio.Queue()

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        raise NotImplementedError

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Sample, None]:
        while (item := await self.feed.get()) is not None:
            if isinstance(item, Exception):
                raise item
            yield item

    async def health(self) -> EngineHealth:
        return EngineHealth(True)


async def _settle() -> None:
    """Lets every task ready to run run."""
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("end", ["fewer", "all", "more", "failed", "cancelled"])
def test_a_request_counts_its_n_then_one_less_a_sample_then_none_once_it_ends(end: str) -> None:
    engine, sink = _Scripted(), RecordingStats()
    got: list[Sample] = []

    def out() -> tuple[int, int]:
        return engine.sequences_in_flight, sink.level("in_flight")

    async def scenario() -> list[tuple[int, int]]:
        task = asyncio.ensure_future(
            deliver(engine, GenerateRequest(prompt="p", n=3), got.append, sink)
        )
        await _settle()
        seen = [out()]
        engine.feed.put_nowait(SAMPLE)
        await _settle()
        seen.append(out())
        for item in {"all": [SAMPLE] * 2, "more": [SAMPLE] * 3}.get(end, []):
            engine.feed.put_nowait(item)
        if end == "cancelled":
            task.cancel()
        else:
            engine.feed.put_nowait(EngineUnavailable("gone") if end == "failed" else None)
        await asyncio.gather(task, return_exceptions=True)
        return [*seen, out()]

    assert run_coroutine(scenario()) == [(3, 3), (2, 2), (0, 0)]
    assert len(got) == {"all": 3, "more": 4}.get(end, 1)


def test_nothing_outside_the_engine_writes_its_count() -> None:
    engine = _Scripted()
    with pytest.raises(AttributeError):
        engine.sequences_in_flight = 1  # type: ignore[misc]
    assert engine.load().running == 0


class _Outstanding(FakeEngine):
    """Unanimous questions whose requests numbered as ``stalls`` says never return unless
    cancelled; counts the sequences its requests hold (``outstanding``)."""

    def __init__(self, questions: int, stalls: Callable[[int], bool]) -> None:
        super().__init__({f"q{i}": [("42", 1.0)] for i in range(questions)})
        self._stalls = stalls
        self._asked = 0
        self.outstanding = 0

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        self._asked += 1
        self.stall = self._stalls(self._asked)
        self.outstanding += request.n
        try:
            return await super().generate(request)
        finally:
            self.outstanding -= request.n


def test_a_jobs_stragglers_stay_in_flight_until_their_requests_end() -> None:
    """Stragglers refunded to the job's policy no longer hold its slots, but the engine
    still runs them: the engine's count and the sink's gauge keep them until they end."""
    engine, sink = _Outstanding(20, lambda n: n % 5 == 0), RecordingStats()
    spec = JobSpec([Question(f"q{i}", "p") for i in range(20)], 320)
    job = Job(spec, engine, last_word, sink, stragglers=Stragglers(floor=0.01))

    async def scenario() -> list[tuple[int, int, int, int]]:
        seen = []
        async for event in job.events():
            if isinstance(event, AnswerEvent):
                ours, gauge = engine.sequences_in_flight, sink.level("in_flight")
                seen.append((engine.outstanding, ours, gauge, job.policy.num_pending))
            elif isinstance(event, DoneEvent):
                assert event.status is JobStatus.COMPLETED
        return seen

    seen = run_coroutine(scenario())
    assert len(seen) == 20
    assert all(outstanding == ours == gauge for outstanding, ours, gauge, _ in seen)
    assert any(ours > pending for _, ours, _, pending in seen)  # stragglers out, not pending
    assert engine.outstanding == engine.sequences_in_flight == sink.level("in_flight") == 0
