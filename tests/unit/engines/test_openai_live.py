"""OpenAIEngine against fake upstreams served by real uvicorn servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from blendserve.engines.base import GenerateRequest, Sample, SamplingParams
from blendserve.engines.config import Health, RetryPolicy, Timeouts
from blendserve.engines.openai import OpenAIEngine
from blendserve.errors import EngineTimeout
from blendserve.testing.fake_openai import FakeServer
from blendserve.testing.stats import RecordingStats

from tests.support.running import run_coroutine

T = TypeVar("T")
Fakes = Callable[..., list[FakeServer]]
CHAT = [{"role": "user", "content": "2+2?"}]


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Polls ``condition`` until it holds; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def _engine(servers: list[FakeServer], **kwargs: Any) -> OpenAIEngine:
    kwargs.setdefault("retry", RetryPolicy(backoff_base=0.01))
    return OpenAIEngine([s.url for s in servers], **kwargs)


def chat(n: int = 1, **kwargs: Any) -> GenerateRequest:
    return GenerateRequest(messages=CHAT, n=n, **kwargs)


def test_equal_replicas_share_concurrent_load(fakes: Fakes) -> None:
    servers = fakes(3, latency=0.3)

    async def main() -> list[list[Sample]]:
        async with _engine(servers) as e:
            return await asyncio.gather(*(e.generate(chat()) for _ in range(30)))

    results = run_coroutine(main())
    assert sum(map(len, results)) == 30
    assert [s.state.requests for s in servers] == [10, 10, 10]
    assert [s.state.max_in_flight for s in servers] == [10, 10, 10]


def test_least_outstanding_keeps_off_a_busy_replica(fakes: Fakes) -> None:
    slow, fast_a, fast_b = fakes(3)
    slow.state.latency = 60.0
    done = 0

    async def worker(e: OpenAIEngine) -> None:
        nonlocal done
        while True:
            await e.generate(chat())
            done += 1

    async def main() -> None:
        async with _engine([slow, fast_a, fast_b]) as e:
            tasks = [asyncio.ensure_future(worker(e)) for _ in range(6)]
            await _until(lambda: done >= 40)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    run_coroutine(main())
    # Six workers start two requests per replica; then a picking worker has just freed a
    # slot on a fast replica, which is then below the slow one's two outstanding requests.
    assert slow.state.requests == 2
    assert fast_a.state.requests + fast_b.state.requests >= 40


def test_same_question_lands_on_one_replica(fakes: Fakes) -> None:
    servers = fakes(3)

    async def main() -> tuple[set[str], set[str], set[str]]:
        async with _engine(servers) as e:
            sequential = set()
            for _ in range(6):
                sequential |= {s.upstream for s in await e.generate(chat(question_id="q-7"))}
            concurrent = await asyncio.gather(
                *(e.generate(chat(question_id="q-8")) for _ in range(4))
            )
            spread = await asyncio.gather(
                *(e.generate(chat(question_id=f"q{i}")) for i in range(30))
            )
            return (
                sequential,
                {s.upstream for r in concurrent for s in r},
                {s.upstream for r in spread for s in r},
            )

    sequential, concurrent, spread = run_coroutine(main())
    assert len(sequential) == 1 and len(concurrent) == 1
    assert len(spread) >= 2


def test_killed_replica_loses_and_duplicates_no_sample(fakes: Fakes) -> None:
    servers = fakes(3, latency=0.02)
    victim = servers[1]

    async def main() -> list[Sample]:
        async with _engine(servers, health=Health(failure_threshold=2, probe_interval=0.05)) as e:
            gate = asyncio.Semaphore(12)

            async def one(i: int) -> list[Sample]:
                async with gate:
                    return await e.generate(chat(n=2, question_id=f"q{i % 10}"))

            tasks = [asyncio.ensure_future(one(i)) for i in range(90)]
            await _until(lambda: victim.state.samples_served >= 10)
            await asyncio.to_thread(victim.kill)
            results = await asyncio.gather(*tasks)
            assert not (await e.health()).upstreams[victim.url]
            return [s for r in results for s in r]

    samples = run_coroutine(main())
    assert len(samples) == 180
    assert len({s.text for s in samples}) == 180
    assert sum(s.state.samples_served for s in servers) == 180
    served_by = {s.url: sum(x.upstream == s.url for x in samples) for s in servers}
    assert served_by == {s.url: s.state.samples_served for s in servers}
    assert 10 <= victim.state.samples_served < 180


def test_unhealthy_replica_is_probed_back_in(fakes: Fakes) -> None:
    back, steady = fakes(2)

    async def main() -> None:
        async with _engine(
            [back, steady], health=Health(failure_threshold=2, probe_interval=0.05)
        ) as e:
            await asyncio.to_thread(back.kill)
            for _ in range(6):
                [sample] = await e.generate(chat())
                assert sample.upstream == steady.url
            health = await e.health()
            assert health.healthy and health.upstreams == {back.url: False, steady.url: True}
            before = back.state.requests
            await asyncio.to_thread(back.start)
            await _until(lambda: e._replicas.snapshot()[back.url])
            assert back.state.model_requests >= 1
            await asyncio.gather(*(e.generate(chat()) for _ in range(10)))
            assert back.state.requests > before

    run_coroutine(main())


def test_cancelling_generate_closes_upstream_requests(fakes: Fakes) -> None:
    [server] = fakes(1, latency=60.0)

    async def main() -> None:
        async with _engine([server], n_support="no") as e:
            task = asyncio.ensure_future(e.generate(chat(n=4)))
            await _until(lambda: server.state.in_flight == 4)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert [r.outstanding for r in e._replicas.replicas] == [0]
            await _until(lambda: server.state.in_flight == 0)
            assert server.state.disconnects == 4

    run_coroutine(main())


def test_ignored_n_is_topped_up_live(fakes: Fakes) -> None:
    [server] = fakes(1, honour_n=False)

    async def main() -> tuple[list[Sample], list[Sample]]:
        async with _engine([server]) as e:
            first = await e.generate(chat(n=5, params=SamplingParams(seed=100)))
            second = await e.generate(chat(n=3))
            return first, second

    first, second = run_coroutine(main())
    assert len(first) == 5 and len(second) == 3
    assert len({s.text for s in first + second}) == 8
    bodies = server.state.bodies
    assert bodies[0]["n"] == 5 and sorted(b["seed"] for b in bodies[:5]) == list(range(100, 105))
    assert len(bodies) == 8 and all("n" not in b for b in bodies[1:])
    assert server.state.samples_served == 8


def test_failures_and_dropped_connections_are_retried(fakes: Fakes) -> None:
    flaky, dropping, steady = fakes(3)
    flaky.state.fail_next = 2
    dropping.state.drop = True

    async def main() -> None:
        async with _engine([flaky], health=Health(failure_threshold=5)) as e:
            assert len(await e.generate(chat(n=3))) == 3
        assert flaky.state.requests == 3
        async with _engine([dropping, steady]) as e:
            samples = await e.generate(GenerateRequest(prompt="p", n=2, question_id="x"))
            assert [s.upstream for s in samples] == [steady.url] * 2
            assert await e.models() == ["fake-model"]

    run_coroutine(main())


def test_a_stalled_stream_is_given_up_after_the_stall_timeout(fakes: Fakes) -> None:
    stalled, live = fakes(2)
    stalled.state.timeout_rate = 1.0  # every stream stops after its first chunk

    async def main() -> tuple[list[Sample], float]:
        async with _engine([stalled, live], stream=True, timeouts=Timeouts(stall=0.5)) as e:
            started = time.monotonic()
            # The question's home replica is the stalled one for some of these ids.
            results = await asyncio.gather(
                *(e.generate(chat(2, question_id=f"q{i}")) for i in range(8))
            )
            return [s for r in results for s in r], time.monotonic() - started

    samples, took = run_coroutine(main())
    assert len(samples) == 16 and {s.upstream for s in samples} == {live.url}
    assert len({s.text for s in samples}) == 16  # each served sample once
    assert stalled.state.requests > 0 and stalled.state.samples_served == 0
    assert live.state.samples_served == 16
    assert took < 5, took  # not the 600 s call deadline


def test_an_upstream_that_only_stalls_is_a_timeout_well_before_the_deadline(
    fakes: Fakes,
) -> None:
    (stalled,) = fakes(1)
    stalled.state.timeout_rate = 1.0

    async def main() -> float:
        async with _engine(
            [stalled],
            stream=True,
            timeouts=Timeouts(stall=0.3),
            retry=RetryPolicy(max_retries=1, backoff_base=0.01),
        ) as e:
            started = time.monotonic()
            with pytest.raises(EngineTimeout):
                await e.generate(chat())
            return time.monotonic() - started

    assert run_coroutine(main()) < 5


def test_stall_timeout_needs_streaming() -> None:
    with pytest.raises(ValueError, match="stall timeout"):
        OpenAIEngine(["http://a/v1"], timeouts=Timeouts(stall=1.0))


@pytest.mark.parametrize("stream_usage", [True, False])
@pytest.mark.parametrize("honour_n", [True, False])
def test_streamed_samples_carry_prompt_tokens(
    fakes: Fakes, stream_usage: bool, honour_n: bool
) -> None:
    # stream_usage=False, honour_n=False is llama.cpp's server: no usage in streams, n ignored.
    [server] = fakes(1, stream_usage=stream_usage, honour_n=honour_n)

    async def main() -> list[list[Sample]]:
        async with _engine([server], stream=True) as e:
            return [await e.generate(chat(n=4, question_id="q")) for _ in range(2)]

    calls = run_coroutine(main())
    assert [[s.prompt_tokens for s in samples] for samples in calls] == [[3] * 4] * 2
    assert all(s.completion_tokens > 0 for samples in calls for s in samples)
    probes = [b for b in server.state.bodies if not b.get("stream")]
    # Asked once per prompt, unstreamed, for one token; never when the stream has usage.
    assert len(probes) == (0 if stream_usage else 1)
    assert all(b["max_tokens"] == 1 and "seed" not in b for b in probes)


def _completed(sink: RecordingStats) -> int:
    booked = (args for name, args in sink.calls if name == "upstream_samples")
    return sum(samples for _, outcome, samples in booked if outcome == "completed")


@pytest.mark.parametrize("n_support", ["yes", "no"])
def test_samples_made_but_never_taken_have_their_tokens_counted(
    fakes: Fakes, n_support: str
) -> None:
    # A caller that closes the stream after one sample (its question settled) leaves
    # samples the upstream made and billed: their tokens are counted by the engine.
    (server,) = fakes(1)
    sink = RecordingStats()

    async def main() -> None:
        async with _engine([server], n_support=n_support) as e:
            e.report_to(sink)
            stream = e.stream(chat(n=4))
            await anext(stream)
            # Booked completed as each reply is read, in the step its request ends.
            await _until(lambda: _completed(sink) == 4)
            await stream.aclose()

    run_coroutine(main())
    counted = [args for name, args in sink.calls if name == "tokens"]
    assert len(counted) == 3  # the one taken is the scheduler's to count
    assert sum(completion for _, completion in counted) == 3 * 5
