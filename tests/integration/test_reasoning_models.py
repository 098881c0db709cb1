"""Reasoning models behind blendserve: the final answer votes, the thought comes back.

A real server on loopback over our fake OpenAI upstream, which writes each
sample as a reasoning model does (see ``THOUGHT_SHAPES``): split by vLLM's
reasoning parser (``reasoning``, or the older ``reasoning_content``), raw
``<think>`` text, R1's thought with no opening tag, gpt-oss's harmony
channels; every thought is full of would-be answers (a box, ``####``, a
choice, numbers), and every third is cut at ``max_tokens``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from blendserve.engines.openai import OpenAIEngine
from blendserve.testing.fake_openai import CUT_TAIL, THOUGHT, THOUGHT_SHAPES, FakeServer, FakeState
from blendserve.testing.live import LiveServer, serve_engine
from blendserve_client import Client

MESSAGES = [{"role": "user", "content": "What is 3 + 4?"}]
#: Each sample's thought tokens, as the fake upstream counts them.
THOUGHT_TOKENS = 2


@pytest.fixture(scope="module", params=THOUGHT_SHAPES)
def shape(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def served(shape: str) -> Iterator[tuple[FakeServer, LiveServer]]:
    state = FakeState(
        name="up",
        thoughts=shape,
        answers=("7",),
        cut_every=3,
        reasoning_tokens=THOUGHT_TOKENS,
    )
    upstream = FakeServer(state).start()
    try:
        with serve_engine(OpenAIEngine([upstream.url])) as live:
            yield upstream, live
    finally:
        upstream.stop()


@pytest.fixture
def client(served: tuple[FakeServer, LiveServer]) -> Iterator[openai.OpenAI]:
    url = served[1].url
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def _final(text: str | None) -> bool:
    """Whether ``text`` is a final answer the fake wrote, thought-free."""
    return text is not None and text.startswith("up:") and text.endswith("final answer is 7.")


@pytest.mark.parametrize("kind", ["auto", "number", "math", "regex"])
def test_solve_votes_the_final_answer_with_usage_that_adds_up(
    served: tuple[FakeServer, LiveServer], kind: str
) -> None:
    answer: dict[str, Any] = {"kind": kind}
    if kind == "regex":
        answer["pattern"] = r"answer is (\d+)"
    body = {
        "questions": [{"messages": MESSAGES}, {"prompt": "What is 3 + 4?"}],
        "budget": 12,
        "answer": answer,
        "include_reasoning": True,
    }
    response = httpx.post(f"{served[1].url}/solve", json=body, timeout=30)
    assert response.status_code == 200, response.text
    result = response.json()
    for got in result["answers"]:
        assert got["answer"] == "7" and list(got["votes"]) == ["7"]
        assert got["reasoning"] == THOUGHT and _final(got["completion"])
        assert got["usage"]["reasoning_tokens"] == THOUGHT_TOKENS * got["samples"]
    # Any 12 samples in a row hold 4 cut ones: they are spent, and never vote.
    assert sum(got["votes"]["7"] for got in result["answers"]) == 8
    usage = result["usage"]
    for field in ("samples", "prompt_tokens", "completion_tokens", "reasoning_tokens"):
        assert usage[field] == sum(a["usage"][field] for a in result["answers"]), field
    assert usage["samples"] == 12 and usage["reasoning_tokens"] == THOUGHT_TOKENS * 12


def test_solve_leaves_the_thought_out_unless_asked_and_streams_it_when_asked(
    served: tuple[FakeServer, LiveServer],
) -> None:
    url = served[1].url
    body: dict[str, Any] = {"questions": [{"messages": MESSAGES}], "budget": 3}
    plain = httpx.post(f"{url}/solve", json=body, timeout=30).json()
    assert plain["answers"][0]["reasoning"] is None and _final(plain["answers"][0]["completion"])
    with httpx.stream(
        "POST",
        f"{url}/solve",
        json={**body, "include_reasoning": True},
        headers={"Accept": "application/x-ndjson"},
        timeout=30,
    ) as response:
        events = [json.loads(line) for line in response.iter_lines() if line]
    (answer,) = [e["data"] for e in events if e["event"] == "answer"]
    assert answer["reasoning"] == THOUGHT and answer["answer"] == "7"


def test_the_sdk_reads_the_chosen_samples_thought(client: openai.OpenAI) -> None:
    options = {"blendserve": {"answer": "number", "budget_per_question": 6}}
    reply = client.chat.completions.create(
        model="fake-model", messages=MESSAGES, extra_body=options
    )
    message = reply.choices[0].message
    extra = message.model_extra or {}
    assert _final(message.content) and extra["reasoning"] == extra["reasoning_content"] == THOUGHT
    vote = reply.model_extra["blendserve"] if reply.model_extra else {}
    assert vote["answer"] == "7" and list(vote["votes"]) == ["7"]
    assert reply.usage is not None and reply.usage.completion_tokens_details is not None
    assert (
        reply.usage.completion_tokens_details.reasoning_tokens == THOUGHT_TOKENS * vote["samples"]
    )


def test_the_sdk_reads_the_chosen_samples_thought_streamed(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="fake-model",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"blendserve": {"answer": "math", "budget_per_question": 6}},
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    for field in ("reasoning", "reasoning_content"):
        assert "".join((d.model_extra or {}).get(field) or "" for d in deltas) == THOUGHT
    assert _final("".join(d.content or "" for d in deltas))
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == THOUGHT_TOKENS * (
        usage.completion_tokens // 5  # the fake counts 5 tokens a sample
    )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_text_completion_carries_its_thought_beside_its_text(
    client: openai.OpenAI, stream: bool
) -> None:
    # vLLM's reasoning parsers leave /v1/completions raw: the fake writes <think> tags there.
    options = {"blendserve": {"answer": "auto", "budget_per_question": 6}}
    if stream:
        chunks = list(
            client.completions.create(
                model="fake-model", prompt="3 + 4 =", stream=True, extra_body=options
            )
        )
        pieces = [c.choices[0] for c in chunks if c.choices]
        text = "".join(p.text for p in pieces)
        reasoning = "".join((p.model_extra or {}).get("reasoning") or "" for p in pieces)
    else:
        reply = client.completions.create(model="fake-model", prompt="3 + 4 =", extra_body=options)
        text, reasoning = reply.choices[0].text, (reply.choices[0].model_extra or {})["reasoning"]
    assert _final(text) and reasoning == THOUGHT


def test_thinking_controls_reach_the_upstream_unchanged() -> None:
    controls = {
        "chat_template_kwargs": {"enable_thinking": False},
        "thinking_token_budget": 64,
        "reasoning_effort": "low",
    }
    state = FakeState(name="up", thoughts="parser", answers=("7",))
    with FakeServer(state) as upstream, serve_engine(OpenAIEngine([upstream.url])) as live:
        with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as client:
            client.chat.completions.create(
                model="fake-model",
                messages=MESSAGES,
                reasoning_effort="low",
                extra_body={
                    "chat_template_kwargs": {"enable_thinking": False},
                    "thinking_token_budget": 64,
                    "blendserve": {"budget_per_question": 2},
                },
            )
        v1_bodies = list(upstream.state.bodies)
        upstream.state.bodies.clear()
        body = {
            "questions": [{"messages": MESSAGES}],
            "budget": 2,
            "sampling": {"extra": controls},
        }
        assert httpx.post(f"{live.url}/solve", json=body, timeout=30).status_code == 200
        solve_bodies = list(upstream.state.bodies)
    for sent in (v1_bodies, solve_bodies):
        assert sent and all({k: b.get(k) for k in controls} == controls for b in sent)


def test_a_question_whose_every_thought_is_cut_has_no_answer_but_its_thought() -> None:
    state = FakeState(name="up", thoughts="tags", answers=("7",), cut_every=1)
    with FakeServer(state) as upstream, serve_engine(OpenAIEngine([upstream.url])) as live:
        body = {"questions": [{"messages": MESSAGES}], "budget": 8}
        (answer,) = httpx.post(f"{live.url}/solve", json=body, timeout=30).json()["answers"]
        with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as client:
            reply = client.chat.completions.create(
                model="fake-model", messages=MESSAGES, extra_body={"blendserve": {"policy": "sc"}}
            )
    assert answer["answer"] is None and answer["votes"] == {} and answer["stopped"] == "truncated"
    (choice,) = reply.choices
    assert choice.finish_reason == "length" and choice.message.content == ""
    assert (choice.message.model_extra or {})["reasoning"] == THOUGHT + CUT_TAIL


def test_the_tags_are_a_setting() -> None:
    tags = ("<reasoning>", "</reasoning>")
    state = FakeState(name="up", thoughts="tags", answers=("7",), reasoning_tags=tags)
    with FakeServer(state) as upstream:
        engine = OpenAIEngine([upstream.url])
        with serve_engine(engine, reasoning_tags=",".join(tags)) as live:
            body = {"questions": [{"messages": MESSAGES}], "budget": 4, "answer": {"kind": "math"}}
            solved = httpx.post(f"{live.url}/solve", json=body, timeout=30).json()
            with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused") as client:
                reply = client.chat.completions.create(
                    model="fake-model",
                    messages=MESSAGES,
                    extra_body={"blendserve": {"answer": "math", "budget_per_question": 4}},
                )
    assert solved["answers"][0]["answer"] == "7"
    vote = reply.model_extra["blendserve"] if reply.model_extra else {}
    assert list(vote["votes"]) == ["7"]
    assert (reply.choices[0].message.model_extra or {})["reasoning"] == THOUGHT


def test_a_model_that_does_not_think_gets_no_thought_fields() -> None:
    state = FakeState(name="up", answers=("7",))
    with FakeServer(state) as upstream, serve_engine(OpenAIEngine([upstream.url])) as live:
        body = {
            "model": "fake-model",
            "messages": MESSAGES,
            "blendserve": {"budget_per_question": 2},
        }
        reply = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=30).json()
        solve = {"questions": [{"messages": MESSAGES}], "budget": 2, "include_reasoning": True}
        solved = httpx.post(f"{live.url}/solve", json=solve, timeout=30).json()
    assert set(reply["choices"][0]["message"]) == {"role", "content"}
    assert set(reply["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert solved["answers"][0]["reasoning"] is None
    assert solved["usage"]["reasoning_tokens"] is None  # not counted upstream: unknown, not 0


def test_the_client_and_the_solve_command_carry_the_thought(tmp_path: Path) -> None:
    state = FakeState(name="up", thoughts="r1", answers=("7",), reasoning_tokens=THOUGHT_TOKENS)
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"messages": MESSAGES}) + "\n")
    with FakeServer(state) as upstream, serve_engine(OpenAIEngine([upstream.url])) as live:
        with Client(live.url) as client:
            result = client.solve([{"messages": MESSAGES}], budget=3, include_reasoning=True)
        done = subprocess.run(
            [sys.executable, "-m", "blendserve.cli", "solve", str(questions), "--budget", "3",
             "--include-reasoning", "--url", live.url, "--no-progress"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    (answer,) = result.answers
    assert (answer.answer, answer.reasoning) == ("7", THOUGHT) and _final(answer.completion)
    assert answer.usage.reasoning_tokens == result.usage.reasoning_tokens == THOUGHT_TOKENS * 3
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert json.loads(line)["reasoning"] == THOUGHT
