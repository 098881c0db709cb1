"""OpenAIEngine.load(): vLLM's running and waiting gauges, read in the background, per replica."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2 as httpx
import pytest
from blendserve.engines.base import EngineLoad, GenerateRequest
from blendserve.engines.openai import OpenAIEngine, _upstreams
from blendserve.engines.openai._upstreams import (
    MAX_LABEL_SETS,
    METRICS_BYTES,
    parse_cost,
    parse_queue,
)
from blendserve.testing.fake_openai import FakeServer
from blendserve.testing.waiting import wait_until
from blendserve.util.cancel import cancel_all

from tests.support.running import run_coroutine

A = "http://a.test:8000/v1"
B = "http://b.test/vllm/v1"  # a server behind a path prefix: its metrics at /vllm/metrics
CHAT = [{"role": "user", "content": "2+2?"}]
HOUR = 3600.0  # a poller that reads once the test's own reading is this old: never
# The tests set an engine's own sequences in flight (``_sequences_in_flight``) where a
# job's requests would move them (Engine.counted_stream, their only writer).

# What vLLM V1 serves, shortened: help and type lines, one label set per engine
# core, and other metrics whose names start alike.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {r0}
vllm:num_requests_running{{engine="1",model_name="m"}} {r1}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {w0}
vllm:num_requests_waiting{{engine="1",model_name="m"}} 0.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} 12.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{engine="0",le="0.3",model_name="m"}} 3.0
vllm:e2e_request_latency_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} 12.0
vllm:e2e_request_latency_seconds_count{{engine="0",model_name="m"}} 12.0
vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="m"}} 9.5
"""


def label_sets(name: str, count: int) -> str:
    """``count`` lines of the series ``name``, each of a label set of its own."""
    return "".join(f'{name}{{x="{i}"}} 1\n' for i in range(count))


def vllm_metrics(running: tuple[int, int], waiting: int) -> str:
    return VLLM_METRICS.format(r0=f"{running[0]}.0", r1=f"{running[1]}.0", w0=f"{waiting}.0")


def chat_reply(body: dict[str, Any]) -> httpx.Response:
    n = body.get("n", 1)
    choices = [
        {"index": i, "message": {"role": "assistant", "content": f"s{i}"}, "finish_reason": "stop"}
        for i in range(n)
    ]
    usage = {"prompt_tokens": 7, "completion_tokens": 10 * n}
    return httpx.Response(200, json={"choices": choices, "usage": usage})


Reply = Callable[[httpx.Request], Awaitable[httpx.Response]]


class FakeUpstreams:
    """Answers completions at once and ``/metrics`` per host as scripted; records both.

    ``metrics[host]``: the Prometheus text to serve, or a response or
    exception to answer with. ``completions``: replaces the completions answer.
    """

    def __init__(self, metrics: dict[str, str | httpx.Response | Exception]) -> None:
        self.metrics = metrics
        self.metrics_requests: list[httpx.Request] = []
        self.completions: Reply | None = None
        self.asked = asyncio.Event()

    def asked_of(self, host: str) -> int:
        return sum(r.url.host == host for r in self.metrics_requests)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/metrics"):
            self.metrics_requests.append(request)
            self.asked.set()
            answer = self.metrics.get(request.url.host, httpx.Response(404))
            if isinstance(answer, Exception):
                raise answer
            if isinstance(answer, httpx.Response):
                return answer
            return httpx.Response(200, text=answer, headers={"content-type": "text/plain"})
        if self.completions is not None:
            return await self.completions(request)
        return chat_reply(json.loads(request.content))


def engine(
    upstreams: FakeUpstreams, urls: list[str], capacity: int | None, **kwargs: Any
) -> OpenAIEngine:
    made = OpenAIEngine(urls, transport=httpx.MockTransport(upstreams), **kwargs)
    made.capacity = capacity  # as the service sets it from --engine-capacity
    return made


# -- parsing -------------------------------------------------------------------


def test_parse_sums_each_gauge_over_label_sets() -> None:
    assert parse_queue(vllm_metrics((3, 4), 2)) == (7, 2)
    assert parse_queue("vllm:num_requests_running 5\n") == (5, 0)  # untyped, unlabelled


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<html><body>404 Not Found</body></html>",
        '{"detail": "Not Found"}',
        "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n",
        "vllm:num_requests_waiting 3\n",  # no running gauge
    ],
)
def test_parse_without_vllm_gauges_is_none(text: str) -> None:
    assert parse_queue(text) is None


def test_parse_refuses_more_label_sets_than_vllm_has() -> None:
    assert parse_queue(label_sets(_upstreams.RUNNING, MAX_LABEL_SETS)) == (MAX_LABEL_SETS, 0)
    many = label_sets(_upstreams.RUNNING, MAX_LABEL_SETS) + label_sets(_upstreams.WAITING, 1)
    with pytest.raises(ValueError, match="4,097 label sets of vllm:num_requests_running"):
        parse_queue(many)
    steps = "vllm:iteration_tokens_total_count"
    assert parse_cost(label_sets(steps, MAX_LABEL_SETS)) == {steps: MAX_LABEL_SETS}
    assert parse_cost(label_sets(steps, MAX_LABEL_SETS + 1)) == {}


@pytest.mark.parametrize("value", ["NaN", "+Inf", "lots"])
def test_parse_refuses_a_gauge_that_is_no_number(value: str) -> None:
    with pytest.raises(ValueError):
        parse_queue(f"vllm:num_requests_running {value}\n")


# -- readings ------------------------------------------------------------------


def test_load_reads_running_and_waiting_of_every_replica_from_their_metrics() -> None:
    async def go() -> None:
        upstreams = FakeUpstreams(
            {"a.test": vllm_metrics((3, 4), 2), "b.test": vllm_metrics((5, 0), 1)}
        )
        async with engine(upstreams, [A, B], capacity=16, api_key="k", load_interval=HOUR) as e:
            await e.refresh_load()
            load = e.load()
            assert load == EngineLoad(32, running=12, waiting=3)  # 16 per replica
            assert load.free == 32 - 12 - 3
            urls = sorted(str(r.url) for r in upstreams.metrics_requests)
            assert urls == ["http://a.test:8000/metrics", "http://b.test/vllm/metrics"]
            assert {r.headers["authorization"] for r in upstreams.metrics_requests} == {"Bearer k"}
            upstreams.metrics["a.test"] = vllm_metrics((0, 0), 0)  # a later reading replaces it
            await e.refresh_load()
            assert e.load() == EngineLoad(32, running=5, waiting=1)

    run_coroutine(go())


def test_own_sequences_sent_since_the_reading_are_added_those_ended_taken_off() -> None:
    async def go() -> None:
        upstreams = FakeUpstreams({"a.test": vllm_metrics((2, 0), 1)})
        async with engine(upstreams, [A], capacity=8, load_interval=HOUR) as e:
            await e.refresh_load()
            assert e.load() == EngineLoad(8, running=2, waiting=1)
            e._sequences_in_flight += 4  # a job's burst, not yet in vLLM's gauges
            assert e.load() == EngineLoad(8, running=6, waiting=1)
            assert e.load().free == 1
            upstreams.metrics["a.test"] = vllm_metrics((6, 0), 1)  # vLLM runs them now
            await e.refresh_load()  # taken with the 4 in flight: not added again
            assert e.load() == EngineLoad(8, running=6, waiting=1)
            e._sequences_in_flight += 6  # 10 of this process's own: more than vLLM shows
            await e.refresh_load()
            assert e.load() == EngineLoad(8, running=9, waiting=1)
            e._sequences_in_flight -= 7  # they ended: taken off the reading at once
            assert e.load() == EngineLoad(8, running=2, waiting=1)  # 3 own, less 1 waiting
            e._sequences_in_flight -= 3  # never below nothing running
            assert e.load() == EngineLoad(8, running=0, waiting=1)

    run_coroutine(go())


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(404, json={"detail": "Not Found"}),
        httpx.Response(200, text="<html>a router's page</html>"),
        httpx.Response(200, text="vllm:num_requests_running 1\n" + "#" * METRICS_BYTES),
        httpx.Response(200, text=label_sets(_upstreams.RUNNING, MAX_LABEL_SETS + 1)),
        httpx.ReadTimeout("no metrics in time"),
    ],
    ids=["404", "not-prometheus", "too-large", "many-label-sets", "timeout"],
)
def test_a_replica_without_metrics_counts_own_in_flight_and_is_left_alone(
    answer: httpx.Response | Exception,
) -> None:
    async def go() -> None:
        upstreams = FakeUpstreams({"a.test": vllm_metrics((4, 1), 2), "b.test": answer})
        held, both = asyncio.Event(), asyncio.Event()
        arrived: list[str] = []

        async def hold(request: httpx.Request) -> httpx.Response:
            arrived.append(request.url.host)
            if len(arrived) == 2:
                both.set()
            await held.wait()
            return chat_reply(json.loads(request.content))

        upstreams.completions = hold
        async with engine(upstreams, [A, B], capacity=None, load_interval=HOUR) as e:
            # Two calls of n=3: least-outstanding balancing sends one to each replica.
            calls = [
                asyncio.ensure_future(e.generate(GenerateRequest(messages=CHAT, n=3)))
                for _ in range(2)
            ]
            e._sequences_in_flight += 6  # as a job's counted streams count them
            await asyncio.wait_for(both.wait(), 10.0)  # the calls reached the upstreams
            assert sorted(arrived) == ["a.test", "b.test"]
            e.capacity = 16
            await e.refresh_load()
            # a's gauges (which count its 3), and b's 3 in flight from this process
            assert e.load() == EngineLoad(32, running=5 + 3, waiting=2)
            asked = upstreams.asked_of("b.test")
            assert asked == 1
            await e.refresh_load()
            assert upstreams.asked_of("b.test") == asked  # left alone for a while
            assert upstreams.asked_of("a.test") == 2
            held.set()
            await asyncio.gather(*calls)

    run_coroutine(go())


def test_a_replica_without_metrics_is_logged_once_at_info(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_upstreams, "METRICS_RETRY_S", 0.0)  # asked again at every reading
    caplog.set_level(logging.DEBUG, logger=_upstreams.__name__)

    async def go() -> None:
        upstreams = FakeUpstreams({})
        async with engine(upstreams, [A], capacity=4, load_interval=HOUR) as e:
            for _ in range(3):
                await e.refresh_load()
        assert upstreams.asked_of("a.test") == 3

    run_coroutine(go())
    levels = [r.levelno for r in caplog.records if "no load at" in r.getMessage()]
    assert levels == [logging.INFO, logging.DEBUG, logging.DEBUG]
    assert "http://a.test:8000/metrics" in caplog.records[0].getMessage()


def test_a_reading_is_parsed_in_a_worker_thread_not_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed_on: list[bool] = []  # whether an event loop ran in the parsing thread
    parse = _upstreams.parse_queue

    def recorded(text: str) -> tuple[int, int] | None:
        try:
            asyncio.get_running_loop()
            parsed_on.append(True)
        except RuntimeError:
            parsed_on.append(False)
        return parse(text)

    monkeypatch.setattr(_upstreams, "parse_queue", recorded)

    async def go() -> None:
        upstreams = FakeUpstreams({"a.test": vllm_metrics((3, 4), 2)})
        async with engine(upstreams, [A], capacity=16, load_interval=HOUR) as e:
            await e.refresh_load()
            assert e.load() == EngineLoad(16, running=7, waiting=2)

    run_coroutine(go())
    assert parsed_on == [False]


def test_no_replica_with_metrics_is_the_base_behaviour() -> None:
    async def go() -> None:
        upstreams = FakeUpstreams({})
        async with engine(upstreams, [A, B], capacity=4, load_interval=HOUR) as e:
            e._sequences_in_flight = 7
            await e.refresh_load()
            assert e.load() == EngineLoad(8, running=7)

    run_coroutine(go())


def test_load_reads_the_fake_upstreams_metrics_over_http(
    fakes: Callable[..., list[FakeServer]],
) -> None:
    (fake,) = fakes(1, latency=60.0)

    async def go() -> None:
        async with OpenAIEngine([fake.url], load_interval=HOUR) as e:
            call = asyncio.ensure_future(e.generate(GenerateRequest(messages=CHAT)))
            await asyncio.to_thread(wait_until, lambda: fake.state.in_flight == 1, 10.0)
            e.capacity = 8
            await e.refresh_load()
            assert e.load() == EngineLoad(8, running=1, waiting=0)
            await cancel_all([call])

    run_coroutine(go())


# -- the poller ----------------------------------------------------------------


def test_no_polling_at_all_without_capacity() -> None:
    async def go() -> None:
        upstreams = FakeUpstreams({"a.test": vllm_metrics((3, 0), 0)})
        before = asyncio.all_tasks()
        e = engine(upstreams, [A], capacity=None)
        e._sequences_in_flight = 2
        assert e.load() == EngineLoad(None, running=2)
        await e.generate(GenerateRequest(messages=CHAT, n=2))
        assert e.load() == EngineLoad(None, running=2)
        assert asyncio.all_tasks() == before  # nothing started
        await e.aclose()
        assert upstreams.metrics_requests == []

    run_coroutine(go())


def test_load_outside_an_event_loop_starts_nothing() -> None:
    upstreams = FakeUpstreams({})
    e = engine(upstreams, [A], capacity=4)
    e._sequences_in_flight = 3
    assert e.load() == EngineLoad(4, running=3)
    run_coroutine(e.aclose())
    assert upstreams.metrics_requests == []


@pytest.mark.parametrize("starter", ["load", "generate"])
def test_the_poller_starts_lazily_and_is_gone_after_aclose(starter: str) -> None:
    async def go() -> None:
        upstreams = FakeUpstreams({"a.test": vllm_metrics((3, 0), 1)})
        before = asyncio.all_tasks()
        e = engine(upstreams, [A], capacity=8, load_interval=0.01)
        assert asyncio.all_tasks() == before  # not on construction
        if starter == "load":
            assert e.load() == EngineLoad(8)  # no reading yet
        else:
            await e.generate(GenerateRequest(messages=CHAT))
        started = asyncio.all_tasks() - before
        assert started  # the poller (and its readings)
        await asyncio.wait_for(upstreams.asked.wait(), 10.0)
        await e.aclose()
        assert all(task.done() for task in started)
        assert asyncio.all_tasks() == before
        asked = len(upstreams.metrics_requests)
        assert e.load().capacity == 8  # a closed engine's load polls nothing
        assert asyncio.all_tasks() == before
        assert len(upstreams.metrics_requests) == asked

    run_coroutine(go())


def test_the_poller_keeps_the_last_reading() -> None:
    async def go() -> None:
        upstreams = FakeUpstreams({"a.test": vllm_metrics((3, 0), 1)})
        async with engine(upstreams, [A], capacity=8, load_interval=0.01) as e:
            e.load()
            # The second request comes after the first reading was kept.
            while len(upstreams.metrics_requests) < 2:
                upstreams.asked.clear()
                await asyncio.wait_for(upstreams.asked.wait(), 10.0)
            assert e.load() == EngineLoad(8, running=3, waiting=1)

    run_coroutine(go())


def test_load_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="load_interval"):
        OpenAIEngine([A], load_interval=0)
