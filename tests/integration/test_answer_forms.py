"""Every surface shows the voted answer as its votes are keyed: ``answer`` is the winning key.

Samples write 144 as ``144.0``, ``144.00``, ``\\boxed{144.0}`` or ``\\frac{288}{2}``; all vote
for the key ``144``. A real uvicorn server on loopback over the replay engine serves them to
``/solve`` (JSON, SSE, NDJSON), the Python client, the ``blendserve solve`` command and ``/v1``.
"""

import asyncio
import itertools
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from blendserve.engines.replay import ReplayEngine
from blendserve.testing.live import LiveServer, serve_engine
from blendserve_client import Answer, AsyncClient, Client

#: How the samples write 144 (never as the key itself), and one wrong answer.
FORMS = ["144.0", "\\boxed{144.0}", "144.00", "\\frac{288}{2}", "144.0", "144.00", "144.0"]
RECORDS = [{"id": "square", "prompt": "What is 12 squared?", "answers": [*FORMS, "12"]}]
QUESTIONS = [{"id": "square", "prompt": "What is 12 squared?"}]
#: The answers extracted from FORMS (a box's content, the rest as written).
WRITTEN = {"144.0", "144.00", "\\frac{288}{2}"}
AUTO = {"blendserve": {"budget_per_question": 16}}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with serve_engine(ReplayEngine(RECORDS, seed=11)) as live:
        yield live


def _voted_as_keyed(vote: Mapping[str, Any]) -> None:
    """``answer`` is the most-voted key of ``votes``; ``answer_text`` a form a sample wrote."""
    votes = vote["votes"]
    assert vote["answer"] in votes
    assert vote["answer"] == max(votes, key=votes.__getitem__) == "144"
    assert vote["answer_text"] in WRITTEN


def _solve(url: str, **body: Any) -> httpx.Response:
    payload = {"questions": QUESTIONS, "budget": 16, **body}
    return httpx.post(f"{url}/solve", json=payload, timeout=30)


@pytest.mark.parametrize("kind", ["auto", "math", "number"])
def test_solve_json(server: LiveServer, kind: str) -> None:
    response = _solve(server.url, answer={"kind": kind})
    assert response.status_code == 200, response.text
    (answer,) = response.json()["answers"]
    _voted_as_keyed(answer)


def test_solve_sse_and_ndjson(server: LiveServer) -> None:
    payload = {"questions": QUESTIONS, "budget": 16, "stream": True}
    with httpx.stream("POST", f"{server.url}/solve", json=payload, timeout=30) as response:
        lines = list(response.iter_lines())
    sse = [
        json.loads(data.removeprefix("data: "))
        for name, data in itertools.pairwise(lines)
        if name == "event: answer"
    ]
    headers = {"Accept": "application/x-ndjson"}
    response = httpx.post(f"{server.url}/solve", json=payload, headers=headers, timeout=30)
    events = [json.loads(line) for line in response.text.splitlines()]
    ndjson = [event["data"] for event in events if event["event"] == "answer"]
    assert len(sse) == len(ndjson) == 1
    for answer in (*sse, *ndjson):
        _voted_as_keyed(answer)


def test_python_client(server: LiveServer) -> None:
    with Client(server.url) as client:
        solved = client.solve(QUESTIONS, budget=16)
        streamed = [e for e in client.stream(QUESTIONS, budget=16) if isinstance(e, Answer)]

    async def solve_async() -> Answer:
        async with AsyncClient(server.url) as client:
            return (await client.solve(QUESTIONS, budget=16)).answers[0]

    for answer in (*solved.answers, *streamed, asyncio.run(solve_async())):
        _voted_as_keyed(answer.model_dump())


def test_the_solve_command_prints_the_voted_key(server: LiveServer, tmp_path: Path) -> None:
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    done = subprocess.run(
        [sys.executable, "-m", "blendserve.cli", "solve", str(questions), "--budget", "16",
         "--url", server.url, "--no-progress"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    _voted_as_keyed(json.loads(line))


@pytest.mark.parametrize("stream", [False, True])
def test_v1_chat_vote(server: LiveServer, stream: bool) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    messages: Any = [{"role": "user", "content": QUESTIONS[0]["prompt"]}]
    reply: Any = client.chat.completions.create(
        model="replay", messages=messages, stream=stream, extra_body=AUTO
    )
    if stream:
        extras = [chunk.model_extra for chunk in reply if chunk.model_extra]
        vote = next(extra["blendserve"] for extra in extras if "blendserve" in extra)
    else:
        vote = reply.model_extra["blendserve"]
    client.close()
    _voted_as_keyed(vote)


def test_v1_completions_votes(server: LiveServer) -> None:
    prompts = [QUESTIONS[0]["prompt"]] * 2
    body = {"model": "replay", "prompt": prompts, **AUTO}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    votes = response.json()["blendserve"]
    assert len(votes) == 2
    for vote in votes:
        _voted_as_keyed(vote)
