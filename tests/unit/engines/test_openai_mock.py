"""OpenAIEngine against httpx2.MockTransport handlers: mapping, parsing, n, retries, errors."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx2 as httpx
import pytest
from blendserve.engines.base import GenerateRequest, SamplingParams
from blendserve.engines.config import Health, RetryPolicy, Timeouts
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.openai.wire import retry_after
from blendserve.errors import (
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    InvalidRequest,
)
from blendserve.util.cancel import within

from tests.support.running import run_coroutine

T = TypeVar("T")
URL = "http://up.test/v1"
OTHER = "http://other.test/v1"
Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]
CHAT = [{"role": "user", "content": "2+2?"}]


class Upstream:
    """Records requests; answers the body's n choices, at most ``choices``, unless scripted."""

    def __init__(self, choices: int | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.choices = choices
        self.script: list[httpx.Response | Exception] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.calls.append((str(request.url), body))
        if self.script:
            step = self.script.pop(0)
            if isinstance(step, Exception):
                raise step
            return step
        return ok(body, self.choices, chat=request.url.path.endswith("/chat/completions"))

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, body in self.calls]


def ok(body: dict[str, Any], choices: int | None = None, chat: bool = True) -> httpx.Response:
    count = body.get("n", 1) if choices is None else min(choices, body.get("n", 1))
    seed = body.get("seed")
    made = [
        {"index": i, "message": {"role": "assistant", "content": f"s{seed}-{i}"}}
        if chat
        else {"index": i, "text": f"s{seed}-{i}"}
        for i in range(count)
    ]
    for choice in made:
        choice["finish_reason"] = "stop"
    usage = {"prompt_tokens": 7, "completion_tokens": 10 * count}
    return httpx.Response(200, json={"choices": made, "usage": usage})


def engine(handler: Handler, urls: list[str] | None = None, **kwargs: Any) -> OpenAIEngine:
    kwargs.setdefault("retry", RetryPolicy(backoff_base=0.001))
    transport = httpx.MockTransport(handler)
    return OpenAIEngine(urls or [URL], transport=transport, **kwargs)


def chat(n: int = 1, **kwargs: Any) -> GenerateRequest:
    return GenerateRequest(messages=CHAT, n=n, **kwargs)


async def _generate(up: Handler, request: GenerateRequest, **kwargs: Any) -> list[Any]:
    async with engine(up, **kwargs) as e:
        return await e.generate(request)


def test_chat_body_maps_every_parameter_and_extra_last() -> None:
    up = Upstream()
    params = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        max_tokens=64,
        stop=("\n\n",),
        seed=3,
        extra={"repetition_penalty": 1.1, "temperature": 0.2},
    )
    request = chat(params=params, model="m-request")
    seen: list[httpx.Request] = []

    async def spy(r: httpx.Request) -> httpx.Response:
        seen.append(r)
        return await up(r)

    run_coroutine(_generate(spy, request, model="m-default", api_key="sk-x"))
    assert seen[0].url == URL + "/chat/completions"
    assert seen[0].headers["authorization"] == "Bearer sk-x"
    assert up.bodies == [
        {
            "model": "m-request",
            "messages": CHAT,
            "temperature": 0.2,
            "top_p": 0.9,
            "max_tokens": 64,
            "top_k": 20,
            "min_p": 0.05,
            "stop": ["\n\n"],
            "repetition_penalty": 1.1,
            "seed": 3,
        }
    ]


def test_defaults_leave_the_body_minimal() -> None:
    up = Upstream()
    run_coroutine(_generate(up, GenerateRequest(prompt="hi"), model="m"))
    assert up.bodies == [{"model": "m", "prompt": "hi"}]
    up = Upstream()
    run_coroutine(_generate(up, GenerateRequest(prompt="hi")))
    assert up.bodies == [{"prompt": "hi"}]


def test_completions_parsing_splits_completion_tokens_exactly() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        choices = [
            {"index": 1, "text": "b", "finish_reason": "length"},
            {"index": 0, "text": "a", "finish_reason": "stop"},
            {"index": 2, "text": "c", "finish_reason": None},
        ]
        usage = {"prompt_tokens": 11, "completion_tokens": 10}
        return httpx.Response(200, json={"choices": choices, "usage": usage})

    samples = run_coroutine(
        _generate(handler, GenerateRequest(prompt="p", n=3), mode="completions")
    )
    assert [s.text for s in samples] == ["a", "b", "c"]
    assert [s.finish_reason for s in samples] == ["stop", "length", None]
    assert [s.completion_tokens for s in samples] == [4, 3, 3]
    assert {s.prompt_tokens for s in samples} == {11}
    assert {s.upstream for s in samples} == {URL}


def test_chat_parsing_uses_per_choice_counts_and_null_content() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        choices = [
            {"index": i, "message": {"content": text}, "finish_reason": reason, "usage": usage}
            for i, (text, reason, usage) in enumerate(
                [
                    ("x", "stop", {"completion_tokens": 9}),
                    (None, "length", {"completion_tokens": 2}),
                ]
            )
        ]
        return httpx.Response(200, json={"choices": choices, "usage": {"completion_tokens": 11}})

    samples = run_coroutine(_generate(handler, chat(n=2)))
    assert [(s.text, s.completion_tokens, s.prompt_tokens) for s in samples] == [
        ("x", 9, 0),
        ("", 2, 0),
    ]


def test_n_honoured_is_one_request() -> None:
    up = Upstream()
    samples = run_coroutine(_generate(up, chat(n=4)))
    assert len(samples) == 4 and len({s.text for s in samples}) == 4
    assert len(up.calls) == 1 and up.bodies[0]["n"] == 4


def test_ignored_n_is_topped_up_with_distinct_seeds_and_remembered() -> None:
    up = Upstream(choices=1)  # llama.cpp: one choice whatever n

    async def main() -> tuple[list[Any], list[Any]]:
        async with engine(up) as e:
            first = await e.generate(chat(n=4, params=SamplingParams(seed=10)))
            second = await e.generate(chat(n=3, params=SamplingParams(seed=0)))
            return first, second

    first, second = run_coroutine(main())
    assert len(first) == 4 and len(second) == 3
    assert up.bodies[0]["n"] == 4 and up.bodies[0]["seed"] == 10
    assert sorted(b["seed"] for b in up.bodies[1:4]) == [11, 12, 13]
    assert all("n" not in b for b in up.bodies[1:])
    # Known not to honour n: the second call sends single requests at once.
    assert sorted(b["seed"] for b in up.bodies[4:]) == [0, 1, 2] and len(up.calls) == 7
    assert sorted(s.text for s in first) == ["s10-0", "s11-0", "s12-0", "s13-0"]


def test_ignored_n_without_seed_gets_random_distinct_seeds() -> None:
    up = Upstream(choices=1)
    samples = run_coroutine(_generate(up, chat(n=6)))
    assert len(samples) == 6
    assert "seed" not in up.bodies[0]
    seeds = [b["seed"] for b in up.bodies[1:]]
    assert len(seeds) == 5 and len(set(seeds)) == 5


def test_n_support_no_and_yes() -> None:
    up = Upstream()
    assert len(run_coroutine(_generate(up, chat(n=3), n_support="no"))) == 3
    assert len(up.calls) == 3 and all("n" not in b for b in up.bodies)
    up = Upstream(choices=2)
    assert (
        len(run_coroutine(_generate(up, chat(n=5, params=SamplingParams(seed=1)), n_support="yes")))
        == 5
    )
    assert [b.get("n") for b in up.bodies] == [5, None, None, None]
    assert [b["seed"] for b in up.bodies] == [1, 3, 4, 5]


def test_more_choices_than_asked_is_a_protocol_error() -> None:
    up = Upstream()
    up.script = [ok({"n": 3})] * 2
    with pytest.raises(EngineProtocolError, match="3 choices for n=2"):
        run_coroutine(_generate(up, chat(n=2), retry=RetryPolicy(max_retries=1)))
    assert len(up.calls) == 2


def test_500_and_429_are_retried_then_succeed() -> None:
    up = Upstream()
    up.script = [
        httpx.Response(500, json={"error": {"message": "boom"}}),
        httpx.Response(429, headers={"Retry-After": "0"}),
        httpx.ConnectError("refused"),
    ]
    samples = run_coroutine(_generate(up, chat(n=2)))
    assert len(samples) == 2 and len(up.calls) == 4


def test_exhausted_retries_raise_unavailable_with_cause() -> None:
    up = Upstream()
    up.script = [httpx.Response(503, text="overloaded")] * 10
    with pytest.raises(EngineUnavailable) as info:
        run_coroutine(
            _generate(
                up,
                chat(),
                retry=RetryPolicy(max_retries=2, backoff_base=0.001),
                health=Health(failure_threshold=10),
            )
        )
    assert len(up.calls) == 3
    assert isinstance(info.value.__cause__, httpx.HTTPStatusError)
    assert "overloaded" in str(info.value)


def test_a_replica_taken_out_fails_fast() -> None:
    up = Upstream()
    up.script = [httpx.ConnectError("refused")] * 10

    async def main() -> None:
        async with engine(
            up,
            retry=RetryPolicy(max_retries=5, backoff_base=0.001),
            health=Health(failure_threshold=2, probe_interval=60),
        ) as e:
            with pytest.raises(EngineUnavailable, match="unhealthy") as info:
                await e.generate(chat())
            assert isinstance(info.value.__cause__, httpx.ConnectError)
            assert (await e.health()).upstreams == {URL: False}
            assert not (await e.health()).healthy

    run_coroutine(main())
    assert len(up.calls) == 2


def test_client_errors_are_not_retried() -> None:
    up = Upstream()
    up.script = [httpx.Response(400, json={"error": {"message": "max_tokens is too large"}})]
    with pytest.raises(EngineProtocolError, match="max_tokens is too large") as info:
        run_coroutine(_generate(up, chat()))
    assert len(up.calls) == 1
    assert isinstance(info.value.__cause__, httpx.HTTPStatusError)


def test_deadline_raises_engine_timeout() -> None:
    async def stuck(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    with pytest.raises(EngineTimeout):
        run_coroutine(_generate(stuck, chat(timeout=0.05)))
    with pytest.raises(EngineTimeout):
        run_coroutine(_generate(stuck, chat(), timeouts=Timeouts(call=0.05)))


def test_read_timeouts_retried_then_engine_timeout() -> None:
    up = Upstream()
    up.script = [httpx.ReadTimeout("slow")] * 3
    with pytest.raises(EngineTimeout) as info:
        run_coroutine(
            _generate(
                up,
                chat(),
                retry=RetryPolicy(max_retries=2, backoff_base=0.001),
                health=Health(failure_threshold=10),
            )
        )
    assert isinstance(info.value.__cause__, httpx.ReadTimeout) and len(up.calls) == 3


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, text="{not json"),
        httpx.Response(200, json={"object": "error"}),
        httpx.Response(200, json={"choices": []}),
        httpx.Response(200, json={"choices": [{"index": 0, "text": "completions-shaped"}]}),
        httpx.Response(200, json={"choices": [{"message": {"content": 3}}]}),
        httpx.Response(200, json=[1, 2]),
    ],
)
def test_unusable_bodies_are_retried_then_protocol_errors(response: httpx.Response) -> None:
    up = Upstream()
    up.script = [response] * 3
    retry = RetryPolicy(max_retries=2, backoff_base=0.001)
    with pytest.raises(EngineProtocolError, match="no usable answer after 3 attempt"):
        run_coroutine(_generate(up, chat(), retry=retry, health=Health(failure_threshold=10)))
    assert len(up.calls) == 3
    up.script = [response]
    assert len(run_coroutine(_generate(up, chat()))) == 1  # the retry's answer is used
    assert len(up.calls) == 5


def test_an_unusable_answer_is_the_replica_s_failure_and_moves_the_retry() -> None:
    """A replica answering 200 with an error page was never taken out: its unusable
    answers went straight to the caller, and the next call went home to it again."""
    calls: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url.host))
        if request.url.host == "up.test":
            return httpx.Response(200, text="<html>502 Bad Gateway</html>")
        return ok(json.loads(request.content))

    async def main() -> None:
        async with engine(
            handler,
            urls=[URL, OTHER],
            retry=RetryPolicy(backoff_base=60),
            health=Health(failure_threshold=2, probe_interval=60),
        ) as e:
            for _ in range(6):  # the same key: rendezvous affinity sends it home each time
                samples = await e.generate(chat(question_id="home-is-up.test"))
                assert [s.upstream for s in samples] == [OTHER]
            assert (await e.health()).upstreams == {URL: False, OTHER: True}

    run_coroutine(main())
    assert calls.count("up.test") == 2 and calls.count("other.test") == 6


def test_retry_fails_over_to_another_replica_at_once() -> None:
    calls: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url.host))
        if request.url.host == "up.test":
            return httpx.Response(502)
        return ok(json.loads(request.content))

    samples = run_coroutine(
        _generate(
            handler, chat(question_id="q"), urls=[URL, OTHER], retry=RetryPolicy(backoff_base=60)
        )
    )
    assert [s.upstream for s in samples] == [OTHER]
    assert calls in (["up.test", "other.test"], ["other.test"])


def test_retry_after_replaces_the_backoff() -> None:
    up = Upstream()
    up.script = [httpx.Response(429, headers={"Retry-After": "0.2"})]
    start = time.monotonic()
    assert len(run_coroutine(_generate(up, chat(), retry=RetryPolicy(backoff_base=60)))) == 1
    assert 0.2 <= time.monotonic() - start < 5 and len(up.calls) == 2


def test_a_backoff_past_the_deadline_gives_up_at_once() -> None:
    up = Upstream()
    up.script = [httpx.Response(503)] * 5
    start = time.monotonic()
    with pytest.raises(EngineUnavailable):
        run_coroutine(
            _generate(up, chat(timeout=3), retry=RetryPolicy(backoff_base=60))
        )  # backoff >= 5 s
    assert time.monotonic() - start < 5 and len(up.calls) == 1


def test_retry_after_is_parsed_and_capped() -> None:
    def after(value: str) -> float | None:
        return retry_after(httpx.Response(429, headers={"Retry-After": value}))

    assert after("1.5") == 1.5
    assert after("100000") == 30.0
    assert after("-3") == 0.0
    assert after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert after("soon") is None
    assert retry_after(httpx.Response(429)) is None


def test_extra_may_not_set_engine_owned_fields() -> None:
    for name in ("n", "seed", "stream"):
        request = chat(params=SamplingParams(extra={name: 2}))
        with pytest.raises(InvalidRequest) as info:
            run_coroutine(_generate(Upstream(), request))
        assert info.value.param == f"params.extra.{name}"


def test_urls_are_normalised_and_checked() -> None:
    e = OpenAIEngine(["http://h:8000", "http://h:8001/", " http://h:8002/v1/ ", "https://x/api/v1"])
    assert e.urls == [
        "http://h:8000/v1",
        "http://h:8001/v1",
        "http://h:8002/v1",
        "https://x/api/v1",
    ]
    assert e.mode == "chat"
    run_coroutine(e.aclose())
    for bad in (["ftp://h"], ["not a url"], ["http://[::1"], ["http://h", "http://h/v1"], []):
        with pytest.raises(ValueError):
            OpenAIEngine(bad)
    with pytest.raises(TypeError):
        OpenAIEngine("http://h")
    with pytest.raises(ValueError):
        OpenAIEngine(["http://h"], n_support="maybe")  # type: ignore[arg-type]


def test_models_is_the_union_and_tolerates_a_dead_replica() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        assert request.headers["authorization"] == "Bearer k"
        if request.url.host == "up.test":
            return httpx.Response(200, json={"data": [{"id": "a"}, {"id": "b"}]})
        if request.url.host == "other.test":
            return httpx.Response(200, json={"data": [{"id": "b"}, {"id": "c"}]})
        raise httpx.ConnectError("refused")

    async def main() -> None:
        async with engine(handler, urls=[URL, OTHER, "http://dead.test"], api_key="k") as e:
            assert await e.models() == ["a", "b", "c"]
        async with engine(handler, urls=["http://dead.test"], api_key="k") as e:
            with pytest.raises(EngineUnavailable):
                await e.models()

    run_coroutine(main())


def test_closed_engine_is_unavailable() -> None:
    async def main() -> None:
        e = engine(Upstream())
        await e.aclose()
        with pytest.raises(EngineUnavailable):
            await e.generate(chat())
        assert not (await e.health()).healthy

    run_coroutine(main())


def test_cancellation_propagates_and_releases_counters() -> None:
    entered: list[int] = []

    async def stuck(request: httpx.Request) -> httpx.Response:
        entered.append(1)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def main() -> None:
        async with engine(stuck, n_support="no") as e:
            task = asyncio.ensure_future(e.generate(chat(n=3)))
            while len(entered) < 3:
                await asyncio.sleep(0.001)
            assert [r.outstanding for r in e._replicas.replicas] == [3]
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert [r.outstanding for r in e._replicas.replicas] == [0]

    run_coroutine(main())


def test_one_failed_sub_request_cancels_its_siblings() -> None:
    started: list[int] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        started.append(1)
        if len(started) == 2:
            return httpx.Response(404, json={"detail": "no such model"})
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def main() -> None:
        async with engine(handler, n_support="no") as e:
            with pytest.raises(EngineProtocolError, match="no such model"):
                await e.generate(chat(n=4))
            assert [r.outstanding for r in e._replicas.replicas] == [0]

    run_coroutine(main())


def test_a_cancellation_racing_with_completion_is_not_swallowed() -> None:
    """asyncio.wait_for on Python 3.10/3.11 fails this for small ``spins``."""

    async def attempt(spins: int) -> bool:
        upstream: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def inner() -> int:
            return await upstream

        outer = asyncio.ensure_future(within(inner(), 10))
        for _ in range(2):
            await asyncio.sleep(0)
        upstream.set_result(1)
        for _ in range(spins):
            await asyncio.sleep(0)
        requested = outer.cancel()
        try:
            await outer
        except asyncio.CancelledError:
            return True
        return not requested

    async def main() -> list[bool]:
        return [await attempt(spins) for spins in range(8)]

    assert all(run_coroutine(main()))


def test_stream_mode_assembles_chunks_and_counts_tokens() -> None:
    import json as _json

    import httpx2 as _httpx
    from blendserve.engines import GenerateRequest as _Request
    from blendserve.engines.openai import OpenAIEngine as _Engine

    seen: list[dict[str, object]] = []

    def handler(request: _httpx.Request) -> _httpx.Response:
        seen.append(_json.loads(request.content))
        chunks = [
            {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
            {"choices": [{"index": 0, "delta": {"content": "The answer "}}]},
            {"choices": [{"index": 0, "delta": {"content": "is 4."}, "finish_reason": "stop"}]},
        ]
        body = "".join(f"data: {_json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return _httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async def scenario() -> list[object]:
        engine = _Engine(["http://up/v1"], transport=_httpx.MockTransport(handler), stream=True)
        try:
            return list(
                await engine.generate(_Request(messages=[{"role": "user", "content": "q"}]))
            )
        finally:
            await engine.aclose()

    (sample,) = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert seen[0]["stream"] is True
    assert sample.text == "The answer is 4."  # type: ignore[attr-defined]
    assert sample.finish_reason == "stop" and sample.completion_tokens == 2  # type: ignore[attr-defined]


def test_session_header_carries_the_question_id() -> None:
    seen: list[str | None] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("x-user-id"))
        return ok(json.loads(request.content))

    async def scenario() -> None:
        transport = httpx.MockTransport(handler)
        async with OpenAIEngine([URL], transport=transport, session_header="x-user-id") as engine:
            await engine.generate(GenerateRequest(messages=CHAT, question_id="q-7"))
            await engine.generate(GenerateRequest(messages=CHAT))
        async with OpenAIEngine([URL], transport=transport) as plain:
            await plain.generate(GenerateRequest(messages=CHAT, question_id="q-8"))

    run_coroutine(scenario())
    assert seen == ["q-7", None, None]


def test_stream_hands_each_sample_over_as_its_single_request_returns() -> None:
    """n single requests with vLLM's seeds (seed + i); each sample as its request ends;
    closing the stream cancels the requests still running."""
    release: dict[int, asyncio.Event] = {}
    bodies: list[dict[str, Any]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        await release.setdefault(body["seed"], asyncio.Event()).wait()
        return ok(body)

    async def main() -> list[str]:
        async with engine(handler) as e:
            stream = e.stream(chat(n=4, params=SamplingParams(seed=10)))
            first = asyncio.ensure_future(anext(stream))
            while len(bodies) < 4:
                await asyncio.sleep(0.001)
            for seed in (12, 11):
                release[seed].set()
            texts = [(await first).text, (await anext(stream)).text]
            await stream.aclose()
            assert [r.outstanding for r in e._replicas.replicas] == [0]
            return texts

    assert run_coroutine(main()) == ["s12-0", "s11-0"]
    assert sorted(b["seed"] for b in bodies) == [10, 11, 12, 13]
    assert all(b.get("n", 1) == 1 for b in bodies)


def test_stream_with_n_support_yes_is_one_request_of_n() -> None:
    up = Upstream()

    async def main() -> list[str]:
        async with engine(up, n_support="yes") as e:
            return [s.text async for s in e.stream(chat(n=3, params=SamplingParams(seed=5)))]

    assert run_coroutine(main()) == ["s5-0", "s5-1", "s5-2"]
    assert [b["n"] for b in up.bodies] == [3]
