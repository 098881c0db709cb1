"""The OpenAI-compatible drop-in, driven by the official ``openai`` SDK.

A real uvicorn server on loopback with the replay engine behind it (and our
fake OpenAI upstream where a raw upstream is needed for passthrough).
"""

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from blendserve.answers import extract
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.testing.fake_openai import FakeServer
from blendserve.testing.live import LiveServer, serve_engine
from blendserve.testing.waiting import wait_until

RECORDS = [
    {"id": "easy", "prompt": "What is 6 times 7?", "answers": ["42"] * 9 + ["41"]},
    {"id": "split", "prompt": "Which is it?", "answers": ["7"] * 6 + ["8"] * 3 + ["9"]},
    {"id": "sure", "prompt": "Three?", "answers": ["3"] * 10},
]
NUMBER = {"blendserve": {"answer": "number", "budget_per_question": 16}}


def _user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


@pytest.fixture
def engine() -> ReplayEngine:
    return ReplayEngine(RECORDS, seed=3)


@pytest.fixture
def server(engine: ReplayEngine) -> Iterator[LiveServer]:
    with serve_engine(engine) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_max_rounds_bounds_the_waves_of_a_request(
    client: openai.OpenAI, engine: ReplayEngine
) -> None:
    options = {"blendserve": {**NUMBER["blendserve"], "max_rounds": 1}}
    reply = client.chat.completions.create(
        model="replay", messages=_user("Which is it?"), extra_body=options
    )
    vote = reply.model_extra["blendserve"] if reply.model_extra else {}
    assert engine.stats.requests == 1 and vote["samples"] == engine.stats.samples >= 1


def test_chat_content_is_a_sample_with_the_voted_answer(
    client: openai.OpenAI, engine: ReplayEngine
) -> None:
    reply = client.chat.completions.create(
        model="replay", messages=_user("Which is it?"), extra_body=NUMBER
    )
    vote = reply.model_extra["blendserve"] if reply.model_extra else {}
    assert reply.object == "chat.completion" and len(reply.choices) == 1
    content = reply.choices[0].message.content
    assert content is not None and extract(content, "number") == vote["answer"]
    # Online stopping (the default): a contested question runs to its cap, 16 + 48, or
    # to its last wave (max_rounds); one that settled stopped below the cap.
    assert vote["samples"] == sum(vote["votes"].values()) == engine.stats.samples
    assert 16 <= vote["samples"] <= 64 and (vote["samples"] < 64 or not vote["settled_early"])
    assert max(vote["votes"], key=vote["votes"].__getitem__) == vote["answer"]
    assert 0 <= vote["confidence"]["asc"] <= 0.5
    usage = reply.usage
    assert usage is not None and usage.completion_tokens > 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_n_returns_the_most_voted_distinct_answers(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="replay",
        messages=_user("Which is it?"),
        n=3,
        extra_body={"blendserve": {"answer": "number", "budget_per_question": 40}},
    )
    vote = reply.model_extra["blendserve"] if reply.model_extra else {}
    answers = [extract(c.message.content or "", "number") for c in reply.choices]
    assert [c.index for c in reply.choices] == list(range(len(answers)))
    assert len(set(answers)) == len(answers) == len(vote["votes"]) <= 3
    counts = [vote["votes"][a] for a in answers if a is not None]
    assert answers[0] == vote["answer"] and counts == sorted(counts, reverse=True)


def test_async_client_with_policy_and_settling() -> None:
    async def scenario(url: str) -> Any:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused") as client:
            options = {
                "answer": "number",
                "budget_per_question": 64,
                "policy": "asc",
                "settle_delta": 0.05,
            }
            return await client.chat.completions.create(
                model="replay", messages=_user("Three?"), extra_body={"blendserve": options}
            )

    with serve_engine(ReplayEngine(RECORDS, seed=1)) as live:
        reply = asyncio.run(scenario(live.url))
    vote = reply.model_extra["blendserve"] if reply.model_extra else {}
    assert vote["answer"] == "3" and vote["settled_early"] and vote["samples"] < 64


def test_streamed_chunks_in_openai_format(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="replay",
        messages=_user("What is 6 times 7?"),
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NUMBER,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert extract(text, "number") == "42"
    assert finishes[-1] == "stop" and finishes.count("stop") == 1
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage is not None and usage.completion_tokens > 0
    assert all(c.id == chunks[0].id for c in chunks)


def test_stream_without_usage_ends_with_done(server: LiveServer) -> None:
    body = {"model": "replay", "messages": _user("Three?"), "stream": True, **NUMBER}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
        lines = [line for line in response.iter_lines() if line]
    assert response.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and '"usage"' not in "".join(lines)


def test_completions_take_a_list_of_prompts_as_one_batch(
    client: openai.OpenAI, engine: ReplayEngine
) -> None:
    reply = client.completions.create(
        model="replay",
        prompt=["What is 6 times 7?", "Three?"],
        extra_body={"blendserve": {"answer": "number", "budget_per_question": 8}},
    )
    votes = reply.model_extra["blendserve"] if reply.model_extra else []
    assert [extract(c.text, "number") for c in reply.choices] == ["42", "3"]
    assert [c.index for c in reply.choices] == [0, 1]
    assert [v["answer"] for v in votes] == ["42", "3"]
    assert sum(v["samples"] for v in votes) == engine.stats.samples
    assert all(1 <= v["samples"] <= 40 and v["settled_early"] for v in votes)


def test_sync_stream_of_completions(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(model="replay", prompt="Three?", stream=True, extra_body=NUMBER)
    )
    assert extract("".join(c.choices[0].text for c in chunks if c.choices), "number") == "3"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_models_are_the_engines(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["replay"]


def test_bad_requests_get_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as bad_n:
        client.chat.completions.create(model="replay", messages=_user("Three?"), n=0)
    with pytest.raises(openai.UnprocessableEntityError) as logprobs:
        client.chat.completions.create(model="replay", messages=_user("Three?"), logprobs=True)
    with pytest.raises(openai.UnprocessableEntityError) as policy:
        client.chat.completions.create(
            model="replay",
            messages=_user("Three?"),
            extra_body={"blendserve": {"policy": "oracle"}},
        )
    for caught, param in ((bad_n, "n"), (logprobs, "logprobs"), (policy, "blendserve.policy")):
        body = caught.value.body
        assert isinstance(body, dict) and body["type"] == "invalid_request_error"
        assert body["code"] == 422 and body.get("param") == param
    assert "logprobs" in str(logprobs.value.body)


def test_passthrough_on_an_engine_without_upstream_returns_plain_samples(
    client: openai.OpenAI, engine: ReplayEngine
) -> None:
    off = {"blendserve": {"enabled": False}}
    reply = client.chat.completions.create(
        model="replay", messages=_user("Three?"), n=3, extra_body=off
    )
    assert len(reply.choices) == 3 and engine.stats.samples == 3
    assert reply.model_extra is None or reply.model_extra.get("blendserve") is None
    chunks = list(
        client.completions.create(model="replay", prompt="Three?", stream=True, extra_body=off)
    )
    assert extract("".join(c.choices[0].text for c in chunks if c.choices), "number") == "3"
    assert engine.stats.samples == 4
    logprobs = client.chat.completions.create(
        model="replay", messages=_user("Three?"), logprobs=True, extra_body=off
    )
    assert len(logprobs.choices) == 1


def test_passthrough_sends_the_body_upstream_unchanged() -> None:
    upstream = FakeServer(name="up").start()
    try:
        with serve_engine(OpenAIEngine([upstream.url])) as live:
            body = {
                "model": "fake-model",
                "messages": _user("hi"),
                "n": 2,
                "logprobs": True,
                "repetition_penalty": 1.1,
                "blendserve": {"enabled": False},
            }
            response = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=10)
    finally:
        upstream.stop()
    assert response.status_code == 200, response.text
    assert [c["message"]["content"] for c in response.json()["choices"]] == ["up:1", "up:2"]
    sent = dict(body)
    del sent["blendserve"]
    assert upstream.state.bodies == [sent]


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_cancels_its_samples(stream: bool) -> None:
    engine = ReplayEngine(RECORDS, latency=LatencyModel(fixed=60))
    with serve_engine(engine) as live:
        body = {"model": "replay", "messages": _user("Three?"), "stream": stream, **NUMBER}
        with (
            pytest.raises(httpx.ReadTimeout),
            httpx.stream(
                "POST", f"{live.url}/v1/chat/completions", json=body, timeout=1.0
            ) as response,
        ):
            for _ in response.iter_lines():
                pass
        # Started; whether still in flight races the server seeing the client go.
        assert engine.stats.requests > 0
        assert wait_until(lambda: engine.stats.in_flight == 0, 5.0, "the samples to end") < 1.0
        assert engine.stats.samples == 0  # cancelled, none of its 60 s samples ran out


def _dataset(size: int) -> list[dict[str, Any]]:
    rng = random.Random(11)
    records = []
    for i in range(size):
        gold, other = str(100 + i), str(900 + i)
        share = rng.choice([0.9, 0.8, 0.7])
        answers = [gold] * round(20 * share) + [other] * round(20 * (1 - share))
        records.append(
            {"id": f"g{i}", "prompt": f"question {i}?", "gold": gold, "answers": answers}
        )
    return records


def test_concurrent_requests_are_grouped_and_match_solve() -> None:
    records = _dataset(50)
    engine = ReplayEngine(records, seed=2)
    grouped = {"sc_mode": "grouped", "group_wait_ms": 400, "default_concurrency": 32}
    with serve_engine(engine, **grouped) as live:

        async def ask_all() -> list[Any]:
            async with openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x") as client:
                options = {"blendserve": {"answer": "number", "budget_per_question": 6}}
                return await asyncio.gather(
                    *(
                        client.completions.create(
                            model="replay", prompt=r["prompt"], extra_body=options
                        )
                        for r in records
                    )
                )

        replies = asyncio.run(ask_all())
        jobs = live.service.dropin.grouper.jobs_started
        questions = [{"id": r["id"], "prompt": r["prompt"]} for r in records]
        solved = httpx.post(
            f"{live.url}/solve",
            json={"questions": questions, "budget_per_question": 6, "answer": {"kind": "number"}},
            timeout=60,
        ).json()
    assert jobs <= 5, jobs
    answers = [r.model_extra["blendserve"][0]["answer"] for r in replies]
    assert [extract(r.choices[0].text, "number") for r in replies] == answers
    grouped = sum(a == r["gold"] for a, r in zip(answers, records, strict=True)) / len(records)
    alone = sum(
        a["answer"] == r["gold"] for a, r in zip(solved["answers"], records, strict=True)
    ) / len(records)
    # Every request got its own question's answer (a wrong mapping scores ~0),
    # and grouped requests are as accurate as one /solve job of the same budget.
    assert grouped >= 0.8 and alone >= 0.8 and abs(grouped - alone) <= 0.1
    assert sum(r.model_extra["blendserve"][0]["samples"] for r in replies) <= 50 * 6


def test_an_engine_that_refuses_every_sample_is_an_openai_bad_gateway() -> None:
    engine = ReplayEngine(RECORDS)
    with serve_engine(engine) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="replay", messages=_user("not recorded"))
        client.close()
    # The engine's protocol error keeps its type through the job: 502, not 503.
    assert caught.value.status_code == 502
    assert "no recorded answers" in str(caught.value.body)


def test_a_quality_target_stops_at_its_confidence_and_a_policy_asks_for_a_group(
    client: openai.OpenAI, server: LiveServer
) -> None:
    target = {"blendserve": {"answer": "number", "confidence": 0.99}}
    reply = client.chat.completions.create(
        model="replay", messages=_user("Three?"), extra_body=target
    )
    vote = reply.model_extra["blendserve"] if reply.model_extra else {}
    # Unanimous: P[p1 < p2] = 2^-(n+1) <= 0.01 from 6 samples on.
    assert vote["answer"] == "3" and vote["samples"] == 6 and vote["settled_early"]
    assert vote["confidence"]["asc"] <= 0.01
    grouped = {"blendserve": {"answer": "number", "policy": "sc", "budget_per_question": 5}}
    reply = client.chat.completions.create(
        model="replay", messages=_user("Three?"), extra_body=grouped
    )
    vote = reply.model_extra["blendserve"] if reply.model_extra else {}
    assert vote["samples"] == 5 and server.service.dropin.grouper.jobs_started == 1
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(
            model="replay", messages=_user("Three?"), extra_body={"blendserve": {"confidence": 1.5}}
        )
    # Nearer certainty than the stopping rule's floor: held at the floor, runs to the cap.
    almost = {"blendserve": {"answer": "number", "confidence": 0.9999999999999999}}
    reply = client.chat.completions.create(
        model="replay", messages=_user("Three?"), extra_body=almost
    )
    assert reply.model_extra and reply.model_extra["blendserve"]["answer"] == "3"
