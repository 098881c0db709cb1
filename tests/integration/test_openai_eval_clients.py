"""What evaluation clients send to ``/v1``: token-id prompts, greedy decoding,
truncation, batches, tokenizer endpoints.

A real uvicorn server on loopback over the replay engine, or over our fake
OpenAI upstream where the test must see what reaches an upstream.
"""

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from blendserve.answers import extract
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.replay import ReplayEngine
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import LiveServer, serve_engine

TOKENS = [14582, 25, 220]
RECORDS: list[dict[str, Any]] = [
    {"id": "tokens", "prompt": TOKENS, "answers": ["42"] * 9 + ["41"]},
    {"id": "words", "prompt": "What is 6 times 7?", "answers": ["42"] * 10},
    {"id": "three", "prompt": "Three?", "answers": ["3"] * 10},
    {"id": "cut", "prompt": "Too long?", "answers": [None] * 10},
    {"id": "some cut", "prompt": "Mostly fine?", "answers": [None] * 5 + ["5"] * 5},
]
SC = {"answer": "number", "budget_per_question": 6}


@pytest.fixture
def engine() -> ReplayEngine:
    return ReplayEngine(RECORDS, seed=5)


@pytest.fixture
def server(engine: ReplayEngine) -> Iterator[LiveServer]:
    with serve_engine(engine) as live:
        yield live


@pytest.fixture
def upstream() -> Iterator[FakeServer]:
    with FakeServer(FakeState(name="up", answers=("7",), tokenizer=True)) as fake:
        yield fake


def _complete(url: str, model: str = "replay", **body: Any) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/completions", json={"model": model, **body}, timeout=30)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


def _error(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


@pytest.mark.parametrize("prompt", [TOKENS, [TOKENS]])
def test_a_token_id_prompt_gets_a_voted_answer(
    server: LiveServer, engine: ReplayEngine, prompt: list[Any]
) -> None:
    reply = _complete(server.url, prompt=prompt, blendserve=SC)
    (choice,) = reply["choices"]
    (vote,) = reply["blendserve"]
    assert extract(choice["text"], "number") == vote["answer"]
    assert vote["answer"] in ("42", "41") and sum(vote["votes"].values()) == vote["samples"]
    assert vote["samples"] == engine.stats.samples > 1
    assert reply["usage"]["prompt_tokens"] == vote["samples"] * len(TOKENS)


def test_each_prompt_of_a_batch_gets_its_own_samples(
    server: LiveServer, engine: ReplayEngine
) -> None:
    # Two prompts with one sample each in one Blend-ASC job: each gets its own
    # (never 0 and 2), and so does each prompt of a batch in the default pool.
    job = {"answer": "number", "budget_per_question": 1, "policy": "blend"}
    for options, spent in ((job, [1, 1]), (SC, None)):
        reply = _complete(server.url, prompt=["What is 6 times 7?", "Three?"], blendserve=options)
        assert [extract(c["text"], "number") for c in reply["choices"]] == ["42", "3"]
        samples = [v["samples"] for v in reply["blendserve"]]
        assert samples == (spent or samples) and min(samples) >= 1
        assert not any(v["partial"] for v in reply["blendserve"])
    token_batch = _complete(server.url, prompt=[TOKENS, TOKENS], blendserve=SC)
    assert all(c["text"] for c in token_batch["choices"])
    assert all(v["samples"] >= 1 for v in token_batch["blendserve"])


def test_token_ids_reach_an_openai_upstream_as_ids(upstream: FakeServer) -> None:
    with serve_engine(OpenAIEngine([upstream.url])) as live:
        voted = _complete(live.url, "fake-model", prompt=[TOKENS], blendserve=SC)
        sent = [b["prompt"] for b in upstream.state.bodies]
        assert sent and all(p == TOKENS for p in sent)
        assert voted["blendserve"][0]["samples"] == upstream.state.samples_served
        upstream.state.bodies.clear()
        passed = _complete(
            live.url, "fake-model", prompt=[TOKENS, TOKENS], blendserve={"enabled": False}
        )
    assert [b["prompt"] for b in upstream.state.bodies] == [[TOKENS, TOKENS]]
    assert "blendserve" not in upstream.state.bodies[0]
    assert passed["id"].startswith("cmpl-up")  # the upstream's own reply


def test_token_ids_pass_through_on_an_engine_without_upstream(
    server: LiveServer, engine: ReplayEngine
) -> None:
    reply = _complete(server.url, prompt=TOKENS, n=2, blendserve={"enabled": False})
    assert [extract(c["text"], "number") in ("42", "41") for c in reply["choices"]] == [True] * 2
    assert engine.stats.samples == 2 and reply.get("blendserve") is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["fine", ""]}, "prompt.1"),
        ({"prompt": ["fine", TOKENS]}, "prompt.1"),
        ({"prompt": [[1, 2], []]}, "prompt.1"),
        ({"prompt": [[1, -2]]}, "prompt.0.1"),
        ({"prompt": [1, 2.5]}, "prompt.1"),
        ({"prompt": [True]}, "prompt.0"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": "fine", "echo": True}, "echo"),
        ({"prompt": "fine", "logprobs": 1}, "logprobs"),
    ],
)
def test_bad_prompts_are_a_422_naming_their_param(
    server: LiveServer, body: dict[str, Any], param: str
) -> None:
    error = _error(server.url, "/v1/completions", {"model": "replay", **body})
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{param}: ")


def test_loglikelihood_requests_are_a_clear_422(server: LiveServer) -> None:
    # What lm-eval sends for a loglikelihood task: voting needs generations.
    body = {"model": "replay", "prompt": "fine", "max_tokens": 1, "logprobs": 1, "echo": True}
    error = _error(server.url, "/v1/completions", body)
    assert error["param"] == "logprobs" and "self-consistency" in error["message"]


def test_a_question_whose_every_sample_was_cut_says_length(server: LiveServer) -> None:
    reply = _complete(server.url, prompt=["Too long?", "Mostly fine?"], blendserve=SC)
    cut, fine = reply["choices"]
    assert cut["finish_reason"] == "length" and cut["text"]
    assert reply["blendserve"][0]["answer"] is None
    assert fine["finish_reason"] == "stop" and extract(fine["text"], "number") == "5"
    body = {"model": "replay", "prompt": "Too long?", "stream": True, "blendserve": SC}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as stream:
        text = "".join(stream.iter_lines())
    assert '"finish_reason": "length"' in text and '"finish_reason": "stop"' not in text


def test_a_truncated_chat_answer_says_length(server: LiveServer) -> None:
    body = {
        "model": "replay",
        "messages": [{"role": "user", "content": "Too long?"}],
        "blendserve": SC,
    }
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    (choice,) = response.json()["choices"]
    assert choice["finish_reason"] == "length" and choice["message"]["content"]


def test_greedy_requests_get_one_sample_by_default(
    server: LiveServer, engine: ReplayEngine
) -> None:
    greedy = [
        _complete(server.url, prompt=prompt, temperature=0, blendserve=SC)
        for prompt in ("What is 6 times 7?", "Three?")
    ]
    votes = [reply["blendserve"][0] for reply in greedy]
    assert [v["samples"] for v in votes] == [1, 1] and engine.stats.samples == 2
    assert [v["temperature"] for v in votes] == [0, 0]
    assert [extract(r["choices"][0]["text"], "number") for r in greedy] == ["42", "3"]
    sampled = _complete(server.url, prompt="Three?", temperature=0.5, blendserve=SC)
    assert sampled["blendserve"][0]["samples"] > 1
    assert sampled["blendserve"][0]["temperature"] == 0.5
    unset = _complete(server.url, prompt="Three?", blendserve=SC)
    assert unset["blendserve"][0]["temperature"] is None


def test_an_operator_greedy_temperature_samples_greedy_requests(upstream: FakeServer) -> None:
    engine = OpenAIEngine([upstream.url])
    with serve_engine(engine, sc_greedy_temperature=0.7) as live:
        body = {
            "model": "fake-model",
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0,
            "blendserve": SC,
        }
        response = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=30)
    vote = response.json()["blendserve"]
    assert vote["samples"] > 1 and vote["temperature"] == 0.7 and vote["answer"] == "7"
    assert {b["temperature"] for b in upstream.state.bodies} == {0.7}


def test_tokenizer_endpoints_pass_through_to_an_upstream_that_has_them(
    upstream: FakeServer,
) -> None:
    with serve_engine(OpenAIEngine([upstream.url])) as live:
        info = httpx.get(f"{live.url}/tokenizer_info", timeout=10)
        tokens = httpx.post(f"{live.url}/tokenize", json={"prompt": "hi"}, timeout=10)
        text = httpx.post(f"{live.url}/detokenize", json={"tokens": [104, 105]}, timeout=10)
        upstream.state.tokenizer = False
        missing = httpx.get(f"{live.url}/tokenizer_info", timeout=10)
    assert info.status_code == 200 and info.json()["eos_token"] == "</s>"
    assert tokens.json()["tokens"] == [104, 105] and text.json()["prompt"] == "hi"
    assert missing.status_code == 404
    assert "upstream has no /tokenizer_info" in missing.json()["error"]["message"]


def test_tokenizer_endpoints_without_an_upstream_are_a_clear_404(server: LiveServer) -> None:
    for response in (
        httpx.get(f"{server.url}/tokenizer_info", timeout=10),
        httpx.post(f"{server.url}/tokenize", json={"prompt": "hi"}, timeout=10),
    ):
        assert response.status_code == 404
        error = response.json()["error"]
        assert "replay engine has no tokenizer" in error["message"] and error["code"] == 404
