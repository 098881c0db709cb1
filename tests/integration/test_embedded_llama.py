"""The embedded default end to end: a real llama.cpp server with Qwen2.5-Coder-0.5B on loopback.

Slow by nature (a 0.5B model on the CPU): one server for the module, few short samples.
"""

import asyncio
import itertools
import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from blendserve.answers import extract
from blendserve.core.signals import ConfidenceSpec
from blendserve.engines import GenerateRequest, Sample, SamplingParams
from blendserve.engines.config import RetryPolicy, Timeouts
from blendserve.engines.embedded import (
    EmbeddedEngine,
    EmbeddedLlamaServer,
    ensure_model,
    run_embedded,
)
from blendserve.engines.openai import OpenAIEngine
from blendserve.service import Settings, create_app
from blendserve.testing.live import LiveServer, serve_engine
from blendserve.testing.waiting import wait_until

from tests.integration.test_metrics import assert_samples_add_up, upstream_samples
from tests.support.confidence import assert_read
from tests.support.running import run_coroutine

pytestmark = [pytest.mark.llama, pytest.mark.slow]

T = TypeVar("T")
QUESTIONS = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "7"),
    ("A box holds 6 eggs. How many eggs are in 5 boxes?", "30"),
    ("Sara had 20 dollars and spent 8. How many dollars are left?", "12"),
    ("There are 9 birds and 5 fly away. How many birds remain?", "4"),
    ("A pen costs 2 dollars. How much do 7 pens cost in dollars?", "14"),
]
INSTRUCTION = " Answer in one or two short sentences and end with the final number."
MODEL = "qwen2.5-coder-0.5b"
#: The model's end-of-text tokens (``<|endoftext|>``, ``<|im_end|>``), as logit_bias keys.
QWEN_ENDS = ("151643", "151645")
#: Tokens of a long sample that set the server's pace: a 50th of the cut one's.
PACE_TOKENS = 30

#: Confidence read from the top 5 logprobs, over windows of 8 tokens and blocks of 5: a
#: sample of :data:`CONFIDENCE_TOKENS` is two whole windows and ends in a short block.
#: llama-cpp-python sorts the whole vocabulary in Python for each token it gives logprobs
#: for, so these samples are short.
CONFIDENCE = ConfidenceSpec(top_logprobs=5, window=8, tail=8, block=5)
CONFIDENCE_TOKENS = 16

#: The model's samples run on the CPU: a coroutine may take minutes.
on_cpu = partial(run_coroutine, timeout=240)


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedLlamaServer]:
    cache = Path(tempfile.gettempdir()) / "blendserve-models"
    live = EmbeddedLlamaServer(ensure_model(MODEL, cache), model_name=MODEL, n_ctx=2048)
    on_cpu(live.start())
    yield live
    on_cpu(live.aclose())
    assert not live.running


def _ask(
    question: str, n: int = 1, max_tokens: int = 160, question_id: str | None = None, **params: Any
) -> GenerateRequest:
    return GenerateRequest(
        messages=[{"role": "user", "content": question + INSTRUCTION}],
        n=n,
        params=SamplingParams(max_tokens=max_tokens, **params),
        question_id=question_id,
    )


def test_n_is_split_into_distinct_seeded_requests(server: EmbeddedLlamaServer) -> None:
    async def scenario() -> list[str]:
        async with OpenAIEngine([server.base_url], timeouts=Timeouts(call=120)) as engine:
            samples = await engine.generate(
                _ask(QUESTIONS[0][0], n=4, max_tokens=32, temperature=1.0, seed=1)
            )
            return [s.text for s in samples]

    texts = on_cpu(scenario())
    assert len(texts) == 4
    assert len(set(texts)) >= 2  # llama.cpp ignores n: distinct seeds give distinct samples


def test_the_server_runs_one_completion_at_a_time(server: EmbeddedLlamaServer) -> None:
    """What the server's one slot (the capacity ``/health`` shows) rests on: two streamed
    requests sent together come one after the other, their chunks never interleaved."""

    async def scenario() -> list[int]:
        arrivals: list[int] = []
        async with httpx.AsyncClient(timeout=120) as client:

            async def ask(i: int) -> None:
                body = {"model": MODEL, "max_tokens": 12, "temperature": 0, "stream": True,
                        "messages": [{"role": "user", "content": QUESTIONS[i][0]}]}  # fmt: skip
                url = f"{server.base_url}/chat/completions"
                async with client.stream("POST", url, json=body) as reply:
                    async for line in reply.aiter_lines():
                        if line.startswith("data: {"):
                            arrivals.append(i)

            await asyncio.gather(ask(0), ask(1))
        return arrivals

    arrivals = on_cpu(scenario())
    assert server.slots == 1
    assert arrivals.count(0) >= 3 and arrivals.count(1) >= 3, arrivals
    switches = sum(a != b for a, b in itertools.pairwise(arrivals))
    assert switches == 1, arrivals


def test_streamed_samples_count_the_prompt_like_unstreamed_ones(
    server: EmbeddedLlamaServer,
) -> None:
    # Streamed as the embedded default streams: llama.cpp's streams carry no usage.
    async def scenario() -> tuple[list[int], list[int]]:
        request = _ask(QUESTIONS[2][0], n=3, max_tokens=4, temperature=1.0, seed=5)
        async with OpenAIEngine([server.base_url], timeouts=Timeouts(call=120)) as plain:
            unstreamed = await plain.generate(request)
        async with OpenAIEngine(
            [server.base_url], stream=True, timeouts=Timeouts(call=120)
        ) as streaming:
            streamed = await streaming.generate(request)
        return [s.prompt_tokens for s in unstreamed], [s.prompt_tokens for s in streamed]

    unstreamed, streamed = on_cpu(scenario())
    assert unstreamed[0] > 10 and streamed == unstreamed == [unstreamed[0]] * 3


def test_answers_are_extractable(server: EmbeddedLlamaServer) -> None:
    async def scenario() -> list[str | None]:
        async with OpenAIEngine([server.base_url], timeouts=Timeouts(call=120)) as engine:
            found = []
            for question, _ in QUESTIONS:
                (sample,) = await engine.generate(_ask(question, temperature=0.2, seed=3))
                found.append(extract(sample.text, "number"))
            return found

    found = on_cpu(scenario())
    assert sum(answer is not None for answer in found) >= 4, found


def test_cancellation_frees_the_upstream(server: EmbeddedLlamaServer) -> None:
    # Timed against the server's own pace, which the other test worker moves.
    def long(max_tokens: int) -> GenerateRequest:
        return _ask(
            "Write the numbers from 1 to 3000, one per line.",
            max_tokens=max_tokens,
            extra={"logit_bias": {token: -100 for token in QWEN_ENDS}},  # it cannot end early
        )

    async def scenario() -> tuple[float, float, float]:
        async with OpenAIEngine(
            [server.base_url], stream=True, timeouts=Timeouts(call=120)
        ) as engine:

            async def seconds(request: GenerateRequest) -> float:
                started = time.monotonic()
                (sample,) = await engine.generate(request)
                assert sample.text
                return time.monotonic() - started

            before = await seconds(long(PACE_TOKENS))
            # Cut 0.3 s in: however long its answer would be, it is cut.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(engine.generate(long(1500)), timeout=0.3)
            short = await seconds(_ask(QUESTIONS[1][0], max_tokens=40, temperature=0.0))
            return before, short, await seconds(long(PACE_TOKENS))

    before, short, after = on_cpu(scenario())
    # Held behind the cut sample, the short one would wait for the rest of its 1,500 tokens.
    assert short < 6 * max(before, after), (before, short, after)
    assert server.running


def _counting(chat: bool, n: int, max_tokens: int, **kwargs: Any) -> GenerateRequest:
    """A request for ``n`` samples that count on past ``max_tokens`` (they cannot end)."""
    text = "Count from 1 to 100, separated by commas:"
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.8,
        extra={"logit_bias": {token: -100 for token in QWEN_ENDS}},
    )
    if chat:
        messages = [{"role": "user", "content": text}]
        return GenerateRequest(messages=messages, n=n, params=params, **kwargs)
    return GenerateRequest(prompt=text, n=n, params=params, **kwargs)


@pytest.mark.parametrize("streamed", [False, True], ids=["unstreamed", "streamed"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_a_samples_confidence_is_read_from_llama_cpps_logprobs(
    server: EmbeddedLlamaServer, chat: bool, streamed: bool
) -> None:
    request = _counting(chat, n=1, max_tokens=CONFIDENCE_TOKENS, confidence=CONFIDENCE)

    async def scenario() -> tuple[list[Sample], list[Sample]]:
        async with OpenAIEngine(
            [server.base_url], stream=streamed, timeouts=Timeouts(call=120)
        ) as engine:
            read = await engine.generate(request)
            unread = await engine.generate(_counting(chat, n=1, max_tokens=4))
            return read, unread

    (sample,), (plain,) = on_cpu(scenario())
    assert sample.completion_tokens == CONFIDENCE_TOKENS, sample
    assert_read(sample.confidence, sample.completion_tokens, CONFIDENCE)
    assert plain.completion_tokens == 4 and plain.confidence is None


def test_a_dead_replica_is_retried_on_the_live_one(server: EmbeddedLlamaServer) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"

    async def scenario() -> int:
        async with OpenAIEngine(
            [dead, server.base_url],
            timeouts=Timeouts(call=120),
            retry=RetryPolicy(backoff_base=0.01),
        ) as engine:
            results = [
                await engine.generate(_ask(q, max_tokens=24, seed=i, question_id=str(i)))
                for i, (q, _) in enumerate(QUESTIONS[:3])
            ]
            return sum(len(r) for r in results)

    assert on_cpu(scenario()) == 3


def test_solve_through_the_service(server: EmbeddedLlamaServer) -> None:
    async def factory() -> OpenAIEngine:
        return OpenAIEngine([server.base_url], timeouts=Timeouts(call=120))

    app = create_app(Settings(default_concurrency=2), engine_factory=factory)
    with LiveServer(app) as live:
        body = {
            "questions": [{"id": str(i), "messages": [{"role": "user", "content": q + INSTRUCTION}]}
                          for i, (q, _) in enumerate(QUESTIONS[:2])],
            "budget": 6,
            "answer": {"kind": "number"},
            "sampling": {"temperature": 0.7, "max_tokens": 120},
        }  # fmt: skip
        result = httpx.post(f"{live.url}/solve", json=body, timeout=240).json()
    assert result["status"] == "completed"
    assert result["budget"]["spent"] == 6 and result["usage"]["completion_tokens"] > 0
    assert all(a["samples"] >= 1 for a in result["answers"])


class _Borrowed(EmbeddedEngine):
    """The embedded engine over the module's server, which outlives it."""

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_samples_add_up_on_the_embedded_engine(server: EmbeddedLlamaServer) -> None:
    # Streamed, as the embedded default runs: llama.cpp answers n=4 with one choice.
    engine = _Borrowed(
        server, OpenAIEngine([server.base_url], stream=True, timeouts=Timeouts(call=120))
    )
    question = {"messages": [{"role": "user", "content": QUESTIONS[3][0] + INSTRUCTION}]}
    with serve_engine(engine) as live:
        before = upstream_samples(live.url, server.base_url)
        body = {
            "questions": [question],
            "budget": 4,
            "concurrency": 4,  # a lone question: one request for n=4
            "answer": {"kind": "number"},
            "sampling": {"temperature": 0.7, "max_tokens": 60},
        }  # fmt: skip
        result = httpx.post(f"{live.url}/solve", json=body, timeout=240).json()
        after = upstream_samples(live.url, server.base_url)
    assert result["status"] == "completed" and result["budget"]["spent"] == 4
    assert after["cancelled"] - before["cancelled"] == 3  # the short answer's missing samples
    assert_samples_add_up(before, after, result)


def test_token_id_prompts_reach_llama_cpp_as_its_own_text(server: EmbeddedLlamaServer) -> None:
    text = f"Question: {QUESTIONS[1][0]}\nAnswer:"
    root = server.base_url.removesuffix("/v1")
    response = httpx.post(f"{root}/extras/tokenize", json={"input": text}, timeout=30)
    tokens = response.json()["tokens"]

    async def scenario() -> tuple[str, list[str], bool]:
        inner = OpenAIEngine([server.base_url], timeouts=Timeouts(call=120))
        engine = EmbeddedEngine(server, inner)  # the server stays the module's
        try:
            ask = GenerateRequest(
                prompt=tokens, n=2, params=SamplingParams(max_tokens=40, temperature=0.7)
            )
            samples = await engine.generate(ask)
            # Not the server's kind of prompt: the service answers it through generate().
            forwarded = await engine.forward("/completions", {"prompt": [tokens]})
            return await server.detokenize(tokens), [s.text for s in samples], forwarded is None
        finally:
            await inner.aclose()

    detokenized, texts, not_forwarded = on_cpu(scenario())
    assert detokenized.strip() == text and len(texts) == 2 and all(texts) and not_forwarded


def test_passthrough_streams_token_by_token(server: EmbeddedLlamaServer) -> None:
    import openai

    async def factory() -> OpenAIEngine:
        return OpenAIEngine([server.base_url], timeouts=Timeouts(call=120))

    with LiveServer(create_app(Settings(), engine_factory=factory)) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
        # llama.cpp lists the model by its name, not its file: other names are refused.
        assert [m.id for m in client.models.list()] == [MODEL]
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="Qwen/Qwen2.5-7B-Instruct", messages=[{"role": "user", "content": "hi"}]
            )
        started = time.monotonic()
        arrivals: list[tuple[float, str]] = []
        for chunk in client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count from one to twenty in words."}],
            max_tokens=40,
            temperature=0,
            stream=True,
            extra_body={"blendserve": {"enabled": False}},
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append((time.monotonic() - started, chunk.choices[0].delta.content))
        client.close()
    # One chunk a token, as the upstream sends them, not the whole text at the end.
    assert len(arrivals) >= 10 and all(len(text) <= 16 for _, text in arrivals)
    assert arrivals[-1][0] > arrivals[0][0]
    assert "one" in "".join(text for _, text in arrivals).lower()


def test_a_killed_llama_server_is_said_dead_and_comes_back() -> None:
    cache = Path(tempfile.gettempdir()) / "blendserve-models"
    server = EmbeddedLlamaServer(
        ensure_model(MODEL, cache), model_name=MODEL, n_ctx=1024, restart_backoff=0.2
    )

    async def factory() -> EmbeddedEngine:
        return await run_embedded(server, timeout=120)

    body = {"questions": [{"prompt": QUESTIONS[0][0]}], "budget": 1,
            "sampling": {"max_tokens": 8}}  # fmt: skip
    with LiveServer(create_app(Settings(), engine_factory=factory)) as live:
        first = server.launches
        assert server._process is not None
        os.kill(server._process.pid, signal.SIGKILL)
        wait_until(
            lambda: httpx.get(f"{live.url}/health", timeout=5).status_code == 503, 5, "a 503"
        )
        refused = httpx.post(f"{live.url}/solve", json=body, timeout=30)
        assert refused.status_code == 503 and "SIGKILL" in refused.json()["error"]["message"]
        wait_until(
            lambda: httpx.get(f"{live.url}/health", timeout=5).status_code == 200, 120, "a restart"
        )
        assert server.launches == first + 1
        health = httpx.get(f"{live.url}/health", timeout=5).json()
        assert health["capacity"] == server.slots == 1  # one completion at a time
        result = httpx.post(f"{live.url}/solve", json=body, timeout=120).json()
        assert result["status"] == "completed" and result["budget"]["spent"] == 1
    assert not server.running
