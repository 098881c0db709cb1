"""The always-open pool on the replay engine: waves, stopping, pacing, leaving, failures."""

import asyncio
import itertools
import math
import random
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, TypeVar

import pytest
from blendserve.answers import extract
from blendserve.core.flatness import Flatness
from blendserve.engines.base import GenerateRequest, Sample, SamplingParams
from blendserve.engines.replay import FaultConfig, LatencyModel, ReplayEngine
from blendserve.errors import EngineUnavailable
from blendserve.scheduler import AnswerEvent, Question
from blendserve.scheduler.ballots import TRUNCATED_LIMIT
from blendserve.scheduler.pool import Pool, PoolSpec
from blendserve.scheduler.spec import Keyer
from blendserve.testing.stats import RecordingStats

from tests.support.fake_engine import FakeEngine, SeedRecordingEngine
from tests.support.running import run_coroutine

T = TypeVar("T")


async def _keyer(text: str) -> tuple[str | None, str | None]:
    answer = extract(text, "number")
    return answer, answer


def _records(size: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    records = []
    for i in range(size):
        share = rng.choice([1.0, 0.9, 0.9, 0.7, 0.5])
        answers = [str(i)] * round(20 * share) + [str(1000 + i)] * round(20 * (1 - share))
        records.append({"id": f"q{i}", "answers": answers})
    return records


def _question(i: int) -> Question:
    return Question(f"q{i}", prompt=f"question {i}")


def test_questions_stop_once_confident_and_the_pool_meets_its_budget() -> None:
    engine = ReplayEngine(_records(240), seed=1, latency=LatencyModel(fixed=0.001))
    pool = Pool(PoolSpec(budget_per_question=5), engine, _keyer)

    async def stream() -> list[AnswerEvent]:
        answers = []
        for start in range(0, 240, 8):  # a client at concurrency 8
            batch = [pool.submit(_question(i)) for i in range(start, start + 8)]
            answers += await asyncio.gather(*batch)
        return answers

    answers = run_coroutine(stream())
    samples = [a.samples for a in answers]
    assert sum(samples) == engine.stats.samples == pool.client().price.num_samples
    assert abs(sum(samples) / len(samples) / 5 - 1) < 0.15
    # The spec's cap bounds every question (a flat pool learns a lower one).
    spec_cap = pool.spec.online.stopping(5).max_num_samples
    assert max(samples) <= spec_cap
    assert pool.rule().max_num_samples <= spec_cap
    clear = [
        (i, a) for i, a in enumerate(answers) if _records(240)[i]["answers"].count(str(i)) != 10
    ]
    assert sum(a.answer == f"{i}" for i, a in clear) >= 0.95 * len(clear)
    assert sum(a.settled_early for a in answers) >= 0.9 * len(answers)
    assert all(a.samples == sum(a.votes.values()) for a in answers)
    # Waves: a question needs few engine requests, not one per sample.
    assert engine.stats.requests < 0.5 * engine.stats.samples
    assert pool.num_rounds / len(answers) <= 3


def test_a_quality_target_stops_each_question_at_its_confidence() -> None:
    engine = ReplayEngine(_records(30, seed=2), seed=3)
    spec = PoolSpec(budget_per_question=None, target=0.01, max_rounds=0)  # no bound on waves
    pool = Pool(spec, engine, _keyer)

    async def ask() -> list[AnswerEvent]:
        return list(await asyncio.gather(*(pool.submit(_question(i)) for i in range(30))))

    for answer in run_coroutine(ask()):
        assert answer.settled_early == (answer.confidence.asc <= 0.01)
        assert answer.settled_early or answer.samples == 64


class _CountingEngine(ReplayEngine):
    """Counts the engine requests of each question."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests_per_question: Counter[str | None] = Counter()

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        self.requests_per_question[request.question_id] += 1
        async for sample in super().replay_stream(request, kind):
            yield sample


def test_each_question_takes_at_most_max_rounds_waves() -> None:
    engine = _CountingEngine(_records(40, seed=4), seed=5)
    # One request a wave, so that requests count rounds.
    spec = PoolSpec(budget_per_question=6.0, max_rounds=3, max_samples_per_request=64)
    pool = Pool(spec, engine, _keyer)

    async def ask() -> list[AnswerEvent]:
        return list(await asyncio.gather(*(pool.submit(_question(i)) for i in range(40))))

    answers = run_coroutine(ask())
    assert len(answers) == 40 and all(a.samples >= 1 for a in answers)
    assert max(engine.requests_per_question.values()) <= 3
    unbounded = _CountingEngine(_records(40, seed=4), seed=5)
    pool = Pool(replace(spec, max_rounds=0), unbounded, _keyer)
    run_coroutine(ask())
    assert max(unbounded.requests_per_question.values()) > 3  # the bound is what held it


def test_first_waves_go_before_top_ups_within_the_concurrency() -> None:
    engine = ReplayEngine(_records(20), seed=4, latency=LatencyModel(fixed=0.002))
    pool = Pool(PoolSpec(budget_per_question=4, concurrency=3), engine, _keyer)

    async def ask() -> list[AnswerEvent]:
        return list(await asyncio.gather(*(pool.submit(_question(i)) for i in range(20))))

    answers = run_coroutine(ask())
    assert len(answers) == 20 and engine.stats.max_sequences_in_flight <= 3
    assert pool.slots.free == 3 and not pool.slots.num_waiting


def test_a_question_whose_caller_leaves_stops_and_does_not_pace() -> None:
    engine = ReplayEngine(_records(2), seed=5, latency=LatencyModel(fixed=10.0))
    pool = Pool(PoolSpec(budget_per_question=4), engine, _keyer)

    async def leave() -> None:
        task = pool.submit(_question(0))
        while engine.stats.in_flight == 0:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.stats.in_flight == 0 and pool.num_open == 0

    run_coroutine(leave())
    assert pool.client().price.num_questions == 0 and pool.slots.free == pool.spec.concurrency


def test_cancel_ends_open_questions_with_partial_answers_and_frees_the_pool() -> None:
    # An even split never reaches the target: only the cut ends the question.
    engine = FakeEngine({"q0": [("1", 0.5), ("2", 0.5)]}, seed=6)
    pool = Pool(PoolSpec(budget_per_question=None, target=1e-6, max_cap=10_000), engine, _keyer)

    async def cut() -> AnswerEvent:
        task = pool.submit(_question(0))
        while not engine.served:  # some samples have voted
            await asyncio.sleep(0)
        engine.stall = True
        sent = len(engine.requests)
        while not (len(engine.requests) > sent and engine.in_flight):  # a stalled wave
            await asyncio.sleep(0)
        stalled = engine.in_flight  # the wave's requests (n is at most 16 each)
        pool.cancel("the service is shutting down")
        event = await task
        assert engine.in_flight == 0 and engine.cancelled == stalled and pool.num_open == 0
        return event

    event = run_coroutine(cut())
    assert event.partial and not event.settled_early
    assert 0 < event.samples == sum(event.votes.values()) == len(engine.served)
    assert event.answer in ("1", "2")
    assert pool.client().price.num_questions == 0 and pool.slots.free == pool.spec.concurrency


def test_an_engine_that_always_fails_is_engine_unavailable() -> None:
    engine = ReplayEngine(_records(1), faults=FaultConfig(error_rate=1.0))
    pool = Pool(PoolSpec(budget_per_question=4, max_consecutive_failures=3), engine, _keyer)

    async def ask() -> AnswerEvent:
        return await pool.submit(_question(0))

    with pytest.raises(EngineUnavailable):
        run_coroutine(ask())
    assert math.isfinite(pool.client().price.price)


def test_a_seeded_question_never_sends_the_same_seed_twice() -> None:
    records = [{"id": f"q{i}", "answers": ["1", "2", "3"]} for i in range(4)]
    engine = SeedRecordingEngine(records)
    spec = PoolSpec(budget_per_question=6, sampling=SamplingParams(seed=7))
    pool = Pool(spec, engine, _keyer)

    async def ask() -> list[AnswerEvent]:
        answers = await asyncio.gather(*(pool.submit(_question(i)) for i in range(4)))
        await pool.aclose()
        return answers

    answers = run_coroutine(ask())
    for answer in answers:
        seeds = engine.seeds[answer.id]
        assert len(seeds) == answer.samples > 1
        assert sorted(seeds) == list(range(7, 7 + len(seeds)))


def test_a_question_whose_samples_keep_being_cut_stops_after_its_first_wave() -> None:
    engine = FakeEngine({"q0": [("cut", 1.0)], "q1": [("7", 0.7), ("8", 0.3)]}, seed=3)
    sink = RecordingStats()
    pool = Pool(PoolSpec(budget_per_question=7), engine, _keyer, sink=sink)
    first_wave = pool.rule().wave_size(0, 0, 0, 0, pool.client().price.log_price)
    assert TRUNCATED_LIMIT <= first_wave <= 4  # the first wave alone is enough to stop

    async def ask() -> list[AnswerEvent]:
        return list(await asyncio.gather(pool.submit(_question(0)), pool.submit(_question(1))))

    cut, fine = run_coroutine(ask())
    served = Counter(q for q, _ in engine.served)
    assert cut.samples == served["q0"] == first_wave
    assert cut.stopped == "truncated" and cut.answer is None
    assert not cut.settled_early and not cut.partial
    assert cut.abstained == "so it is cut" and cut.abstained_finish_reason == "length"
    assert fine.stopped is None and fine.answer == "7" and fine.settled_early
    assert fine.samples == served["q1"] >= cut.samples
    # Only the answered question paces tau; the cut one is reported as not settled.
    paced = pool.client().price
    assert paced.num_questions == 1 and paced.num_samples == fine.samples
    answered = sorted((args[0], args[3]) for args in sink.of("answered"))
    assert answered == sorted([(cut.samples, False), (fine.samples, True)])
    assert pool.num_open == 0 and pool.slots.free == pool.spec.concurrency


def test_a_clients_flood_of_unanimous_questions_does_not_move_another_clients_pacing() -> None:
    records = [{"id": f"e{i}", "answers": ["7"]} for i in range(200)] + _records(40, seed=4)
    engine = ReplayEngine(records, seed=1)
    pool = Pool(PoolSpec(budget_per_question=8), engine, _keyer)
    fresh = pool.spec.price().price

    async def flood() -> list[AnswerEvent]:
        answers = []
        for start in range(0, 200, 20):
            batch = [
                pool.submit(Question(f"e{i}", prompt="7?"), "flood")
                for i in range(start, start + 20)
            ]
            answers += await asyncio.gather(*batch)
        return answers

    run_coroutine(flood())
    flooding, other = pool.client("flood"), pool.client("other")
    # The flooding client's price fell towards its own spend of the budget (unanimous
    # questions are worth little more than their first wave) ...
    assert flooding.price.price < fresh / 4 and flooding.learning.flatness.disagreement < 0.1
    assert 0.5 < flooding.price.mean_samples / 8 < 1.2
    # ... and the other client starts where a fresh pool does: price, first wave and cap.
    assert other.price.price == fresh and other.price.num_questions == 0
    budget = pool.spec.budget_per_question
    assert budget is not None
    assert pool.rule("other") == pool.spec.online.stopping(budget, Flatness())
    assert pool.rule("flood").min_first < pool.rule("other").min_first == 4

    async def ask() -> list[AnswerEvent]:
        return list(await asyncio.gather(*(pool.submit(_question(i), "other") for i in range(40))))

    answers = run_coroutine(ask())
    assert other.price.num_questions == 40 == len(answers)
    assert pool.num_questions == 240 and pool.mean_samples == pool.num_samples / 240
    # The pool's unnamed client is a client of its own.
    assert pool.client().price.num_questions == 0


def test_each_client_keys_with_a_keyer_of_its_own_and_idle_clients_are_forgotten() -> None:
    records = [{"id": f"q{i}", "answers": ["5"]} for i in range(6)]
    engine = ReplayEngine(records, seed=1, latency=LatencyModel(fixed=0.01))
    keyed: list[int] = []  # which keyer keyed each sample
    made = itertools.count()

    def client_keyer() -> Keyer:
        number = next(made)

        async def keyer(text: str) -> tuple[str | None, str | None]:
            keyed.append(number)
            return await _keyer(text)

        return keyer

    pool = Pool(
        PoolSpec(budget_per_question=4), engine, _keyer, client_keyer=client_keyer, max_clients=2
    )

    async def scenario() -> None:
        first = pool.client("a")  # keyer 0
        await pool.submit(_question(0), "a")
        await pool.submit(_question(1), "b")  # keyer 1
        assert pool.client("a") is first  # known, and now the most recent
        open_c = pool.submit(_question(2), "c")  # keyer 2; over max_clients: b, idle, goes
        pool.client("d")  # keyer 3; a is idle and goes, c's question is open: c stays
        assert pool.client("c").num_open == 1 and not open_c.done()
        await open_c
        assert pool.client("c").num_open == 0
        assert pool.client("a") is not first  # forgotten: keyer 4, its pacing from the start

    run_coroutine(scenario())
    assert next(made) == 5
    assert set(keyed) == {0, 1, 2}  # a's answers with a's keyer, b's with b's, c's with c's
    assert pool.num_open == 0
