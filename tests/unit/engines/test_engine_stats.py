"""Engines report samples, retries, latency and health to their sink; no Prometheus."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TypeVar

import httpx2 as httpx
import pytest
from blendserve.engines.base import GenerateRequest
from blendserve.engines.config import Health, RetryPolicy
from blendserve.engines.replay import FaultConfig, ReplayEngine
from blendserve.errors import EngineProtocolError, EngineUnavailable
from blendserve.stats import NO_STATS
from blendserve.testing.stats import RecordingStats

from tests.support.running import run_coroutine
from tests.unit.engines.test_openai_mock import CHAT, OTHER, URL, Upstream, engine

T = TypeVar("T")


def test_an_openai_engine_announces_its_replicas_and_counts_outcomes() -> None:
    sink = RecordingStats()
    up = Upstream()
    up.script = [httpx.Response(503)]

    async def run() -> None:
        async with engine(
            up, [URL], sink=sink, retry=RetryPolicy(max_retries=1, backoff_base=0.001)
        ) as e:
            assert e.sink is sink
            await e.generate(GenerateRequest(messages=CHAT, n=2))  # 503, then 2 samples
            up.script = [httpx.Response(400, json={"error": {"message": "no"}})]
            with pytest.raises(EngineProtocolError):
                await e.generate(GenerateRequest(messages=CHAT, n=3))  # a 400

    run_coroutine(run())
    assert sink.of("upstream_configured") == [(URL,)]
    assert sink.health(URL) == 1.0
    assert sink.samples(URL) == {"dispatched": 7, "failed": 5, "completed": 2}
    assert sink.of("upstream_retry") == [(URL,)]
    assert len(sink.of("upstream_latency")) == 1


def _balanced(counts: Counter[str]) -> bool:
    """Every dispatched sample has exactly one outcome (nothing is in flight)."""
    return counts["dispatched"] == counts["completed"] + counts["failed"] + counts["cancelled"]


def test_choices_an_upstream_never_made_count_as_cancelled() -> None:
    sink = RecordingStats()
    up = Upstream(choices=1)  # llama.cpp: one choice whatever n

    arrived = 0
    all_three = asyncio.Event()

    async def gated(request: httpx.Request) -> httpx.Response:
        # The first three requests are answered only once all three were sent.
        nonlocal arrived
        arrived += 1
        if arrived == 3:
            all_three.set()
        if arrived <= 3:
            await all_three.wait()
        return await up(request)

    async def run() -> list[int]:
        async with engine(gated, [URL], sink=sink) as e:
            # Three calls at once ask for n before the first short answer is known.
            first = await asyncio.gather(
                *(e.generate(GenerateRequest(messages=CHAT, n=4)) for _ in range(3))
            )
            later = await e.generate(GenerateRequest(messages=CHAT, n=3))  # known: singles
            return [len(samples) for samples in [*first, later]]

    assert run_coroutine(run()) == [4, 4, 4, 3]
    counts = sink.samples(URL)
    assert counts["completed"] == 15 and counts["cancelled"] == 3 * 3 and _balanced(counts)
    assert counts["dispatched"] == len(up.calls) + 9  # each short answer asked for 4


def test_a_short_answer_balances_with_n_always_sent() -> None:
    sink = RecordingStats()
    up = Upstream(choices=2)

    async def run() -> int:
        async with engine(up, [URL], sink=sink, n_support="yes") as e:
            return len(await e.generate(GenerateRequest(messages=CHAT, n=5)))

    assert run_coroutine(run()) == 5
    assert sink.samples(URL) == {"dispatched": 8, "completed": 5, "cancelled": 3}


@pytest.mark.parametrize(
    ("response", "stream"),
    [
        (httpx.Response(200, text="{not json"), False),
        (httpx.Response(200, json={"choices": [{"index": 0}]}), False),
        (httpx.Response(200, text="data: {not json\n\n"), True),
    ],
)
def test_an_unusable_answer_fails_every_sample_asked(
    response: httpx.Response, stream: bool
) -> None:
    sink = RecordingStats()
    up = Upstream()
    up.script = [response] * 3  # the first attempt and both retries

    async def run() -> None:
        retry = RetryPolicy(max_retries=2, backoff_base=0.001)
        async with engine(up, [URL], sink=sink, stream=stream, retry=retry) as e:
            with pytest.raises(EngineProtocolError):
                await e.generate(GenerateRequest(messages=CHAT, n=3))

    run_coroutine(run())
    # An unusable answer is retried: each of the 3 attempts failed all 3 samples.
    assert sink.samples(URL) == {"dispatched": 9, "failed": 9}


def test_report_to_moves_an_engine_to_another_sink_with_its_state() -> None:
    first, second = RecordingStats(), RecordingStats()
    up = Upstream()
    up.script = [httpx.ConnectError("down")] * 3

    async def run() -> None:
        async with engine(up, [URL, OTHER], sink=first, health=Health(failure_threshold=1)) as e:
            with pytest.raises(EngineUnavailable):
                await e.generate(GenerateRequest(messages=CHAT, question_id="q"))
            e.report_to(second)
            assert e.sink is second

    run_coroutine(run())
    assert first.health(URL) == first.health(OTHER) == 0.0
    # The new sink hears of every replica and its state now, then nothing old.
    assert second.of("upstream_configured") == [(URL,), (OTHER,)]
    assert second.health(URL) == second.health(OTHER) == 0.0
    assert not second.of("upstream_samples")


def test_the_replay_engine_reports_as_one_upstream() -> None:
    sink = RecordingStats()
    records = [{"id": "a", "answers": ["1"]}]
    replay = ReplayEngine(records, faults=FaultConfig(error_rate=1.0), sink=sink)
    request = GenerateRequest(prompt="A?", n=4, question_id="a")
    with pytest.raises(EngineUnavailable):
        run_coroutine(replay.generate(request))
    replay.faults = FaultConfig()
    assert len(run_coroutine(replay.generate(request))) == 4
    assert sink.of("upstream_configured") == [("replay",)] and sink.health("replay") == 1
    assert sink.samples("replay") == {"dispatched": 8, "failed": 4, "completed": 4}
    assert len(sink.of("upstream_latency")) == 1


def test_engines_report_nowhere_by_default() -> None:
    assert ReplayEngine([{"id": "a", "answers": ["1"]}]).sink is NO_STATS
    assert engine(Upstream()).sink is NO_STATS
