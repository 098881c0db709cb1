"""A job that cannot see its engine's capacity does not wait on stragglers it does not need.

The real ``blendserve serve --upstreams URL`` (no ``--engine-capacity``) in front of
the fake upstream (:mod:`blendserve.testing.fake_openai`, a real HTTP server that runs no
model), every fifth completion request of which takes far longer than the rest.
"""

import json
from typing import Any

import httpx
import pytest
from blendserve.testing.command import serve_command
from blendserve.testing.fake_openai import FakeServer, FakeState

pytestmark = pytest.mark.slow

#: Seconds a straggler takes: far past the rest, whose answers come at once, and far
#: past what the job takes on a slow, busy host (the test ends with the job).
SLOW_S = 90.0
IDS = [f"q{i}" for i in range(20)]
QUESTIONS = [
    {"id": q, "messages": [{"role": "user", "content": f"{q}: what is 6 * 7?"}]} for q in IDS
]


def test_answers_come_while_the_stragglers_are_still_out() -> None:
    """The issue's case scaled down: 20 unanimous questions, a budget of 16 each, every
    fifth sample a straggler. A job held at its few slots by stragglers answered nothing
    until they came back; now every question is answered while none of them has."""
    state = FakeState(name="straggly", answers=("42",), slow_every=5, slow_latency=SLOW_S)
    body = {"questions": QUESTIONS, "budget": 320, "answer": {"kind": "number"}, "stream": True}
    events: list[tuple[str, dict[str, Any], int]] = []  # with the stragglers answered by then
    with (
        FakeServer(state) as upstream,
        serve_command("--upstreams", upstream.url) as (url, _),
        httpx.stream("POST", f"{url}/solve", json=body, timeout=4 * SLOW_S) as response,
    ):
        assert response.status_code == 200
        name = ""
        for line in response.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line[5:]), state.slow_answered))
                if state.slow_answered:
                    break  # a straggler came back first: the job waited on it
    answers = [(data, back) for name, data, back in events if name == "answer"]
    assert [back for _, back in answers] == [0] * len(QUESTIONS), "a straggler came back first"
    assert sorted(data["id"] for data, _ in answers) == sorted(IDS)
    assert all(data["answer"] == "42" for data, _ in answers)
    name, done, back = events[-1]
    assert name == "done" and done["status"] == "completed" and back == 0
    # Stragglers were sent, more than a job of 20 open questions has slots (five).
    assert state.requests // state.slow_every > 5
