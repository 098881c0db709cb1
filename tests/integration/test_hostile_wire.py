"""Upstreams that answer 200 with something unusable: an error page, a token count past
any context, a malformed or failed stream; and streams framed as SSE allows.

The real service on loopback over the OpenAI engine, in front of fake upstreams
(:mod:`blendserve.testing.fake_openai`, real HTTP servers that run no model): as
``blendserve serve`` builds it from its settings, or over an engine made here
where a test needs a replica's breaker to stay open while it looks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from blendserve.engines.config import Health, Timeouts
from blendserve.engines.openai import OpenAIEngine
from blendserve.service import Settings, create_app
from blendserve.testing.accounting import Accounting, assert_accounting
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import KEYS, LiveServer, serve_engine

pytestmark = pytest.mark.slow

POISON = "poisoned question"
STALL_S = 5.0  # a stall timeout: samples are streamed


@pytest.fixture
def fakes() -> Iterator[Callable[..., FakeServer]]:
    """Starts fake upstreams, ``fakes(name, **knobs)``, each answering 42; all killed after."""
    started: list[FakeServer] = []

    def start(name: str, **knobs: Any) -> FakeServer:
        knobs.setdefault("answers", ("42",))
        server = FakeServer(FakeState(name=name, record=False, **knobs)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


def _serve(*upstreams: FakeServer, stream: bool = False, **settings: Any) -> LiveServer:
    """The service as ``blendserve serve --upstreams ...`` builds it (engine included; the
    answer keys' worker shared)."""
    config = Settings(
        upstreams=tuple(u.url for u in upstreams),
        upstream_stall_timeout=STALL_S if stream else None,
        default_concurrency=4,
        group_wait_ms=0,
        **settings,
    )
    return LiveServer(
        create_app(config, answer_keys=KEYS), connections=config.connection_timeouts()
    )


def _engine(*upstreams: FakeServer, stream: bool = False) -> OpenAIEngine:
    """An engine as serve makes it, but a replica's open breaker is not probed while a test
    looks."""
    return OpenAIEngine(
        [u.url for u in upstreams],
        stream=stream,
        timeouts=Timeouts(call=30.0, stall=STALL_S if stream else None),
        health=Health(probe_interval=60.0),
    )


def _question(qid: str, text: str = "What is 6 * 7?") -> dict[str, Any]:
    return {"id": qid, "messages": [{"role": "user", "content": text}]}


def _solve(url: str, questions: list[dict[str, Any]], budget: int) -> httpx.Response:
    payload = {"questions": questions, "budget": budget, "answer": {"kind": "number"}}
    return httpx.post(f"{url}/solve", json=payload, timeout=60)


def _chat(url: str, text: str = "What is 6 * 7?", budget: int = 4) -> httpx.Response:
    body = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": text}],
        "blendserve": {"answer": "number", "budget_per_question": budget},
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def _outcomes(accounting: Accounting, upstream: FakeServer) -> dict[str, float]:
    return dict(accounting.samples[upstream.url])


# --- item: a token count past any context -------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_token_count_past_any_context_fails_its_sample_not_the_batch(
    fakes: Callable[..., FakeServer], stream: bool
) -> None:
    """``completion_tokens: 10**400`` overflowed a Prometheus counter inside the job: a 500
    for the whole /solve, the plain question's answer lost with it."""
    upstream = fakes("huge", usage_tokens=10**400, target=POISON)
    with _serve(upstream, stream=stream) as live:
        solved = _solve(live.url, [_question("poison", POISON), _question("plain")], 8)
        poisoned = _chat(live.url, POISON)
        plain = _chat(live.url)
        accounting = assert_accounting(live.url, [upstream.url])
    assert solved.status_code == 200, solved.text
    answers = {a["id"]: a for a in solved.json()["answers"]}
    assert answers["plain"]["answer"] == "42", solved.text
    assert answers["poison"]["samples"] == 0 and answers["poison"]["answer"] is None
    assert poisoned.status_code in (502, 503), poisoned.text  # an upstream's fault, said so
    assert "tokens" in poisoned.json()["error"]["message"] or poisoned.status_code == 503
    assert plain.status_code == 200, plain.text
    assert "42" in plain.json()["choices"][0]["message"]["content"]
    assert _outcomes(accounting, upstream)["failed"] > 0


# --- item: a replica that answers 200 with an unusable body ----------------------------------

UNUSABLE = {
    "error_page": ({"garbage_2xx": True}, False),
    "error_page_streamed": ({"garbage_2xx": True}, True),
    "stream_error": ({"stream_error": True, "answers": ("7",)}, True),
    "bad_chunk": ({"bad_chunk": {"choices": [{"index": [0], "delta": {"content": "7"}}]}}, True),
}


@pytest.mark.parametrize("kind", list(UNUSABLE))
def test_a_replica_answering_unusably_is_taken_out_and_the_other_serves(
    fakes: Callable[..., FakeServer], kind: str
) -> None:
    """A replica answering every completion ``200 text/html`` (a proxy's error page) got
    265 requests to the good one's 9, never had its breaker opened, and most answers
    failed: its unusable answers went straight out, without another replica tried."""
    knobs, stream = UNUSABLE[kind]
    bad = fakes("bad", **knobs)
    good = fakes("good")
    engine = _engine(bad, good, stream=stream)
    with serve_engine(engine, default_concurrency=8) as live:
        questions = [_question(f"q{i}", f"What is 6 * 7? ({i})") for i in range(8)]
        solved = _solve(live.url, questions, 64)
        chats = [_chat(live.url, f"Say 42 ({i})") for i in range(10)]
        health = httpx.get(f"{live.url}/health", timeout=10).json()
        accounting = assert_accounting(live.url, engine.urls)
    assert solved.status_code == 200, solved.text
    result = solved.json()
    assert result["status"] == "completed", result.get("error")
    assert [a["answer"] for a in result["answers"]] == ["42"] * 8
    # No sample of the bad replica voted (its partial streams would say 7).
    assert all(set(a["votes"]) == {"42"} for a in result["answers"]), result["answers"]
    assert [c.status_code for c in chats] == [200] * 10, [c.text for c in chats]
    assert health["upstreams"] == {bad.url: False, good.url: True}
    # Out after its breaker's failures in a row, and those of requests already in flight.
    assert bad.state.requests <= 3 + 8, bad.state.requests
    outcomes = _outcomes(accounting, bad)
    assert outcomes["failed"] == outcomes["dispatched"] > 0
    assert outcomes.get("completed", 0) == 0 and outcomes.get("cancelled", 0) == 0
    assert _outcomes(accounting, good).get("failed", 0) == 0


def test_one_replica_answering_unusably_fails_a_call_as_a_protocol_error(
    fakes: Callable[..., FakeServer],
) -> None:
    upstream = fakes("only", garbage_2xx=True)
    with _serve(upstream) as live:
        reply = _chat(live.url)
        accounting = assert_accounting(live.url, [upstream.url])
    assert reply.status_code == 502, reply.text
    assert "not JSON" in reply.json()["error"]["message"]
    assert upstream.state.requests >= 3  # retried, and taken out after its breaker's three
    assert _outcomes(accounting, upstream)["failed"] == upstream.state.requests


# --- item: malformed streamed chunks ------------------------------------------------------

MALFORMED = {
    "index_list": {"choices": [{"index": [0], "delta": {"content": "7"}}]},
    "index_dict": {"choices": [{"index": {"i": 0}, "delta": {"content": "7"}}]},
    "index_mixed": {
        "choices": [{"index": 0, "delta": {"content": "7"}}, {"index": "1", "delta": {}}]
    },
    "content_number": {"choices": [{"index": 0, "delta": {"content": 7}}]},
    "content_list": {"choices": [{"index": 0, "delta": {"content": ["7"]}}]},
}


@pytest.mark.parametrize("shape", list(MALFORMED))
def test_a_malformed_chunk_is_a_counted_protocol_error_not_an_internal_one(
    fakes: Callable[..., FakeServer], shape: str
) -> None:
    """Such chunks raised TypeError: the job failed with "an internal error" and every
    attempt was booked cancelled, not failed."""
    bad = fakes("malformed", bad_chunk=MALFORMED[shape], answers=("7",))
    good = fakes("good")
    with _serve(bad, good, stream=True) as live:
        # Eight questions: some have the bad replica for their home (rendezvous hashing).
        questions = [_question(f"q{i}", f"What is 6 * 7? ({i})") for i in range(8)]
        solved = _solve(live.url, questions, 16)
        accounting = assert_accounting(live.url, [bad.url, good.url])
    assert solved.status_code == 200, solved.text
    result = solved.json()
    assert result["status"] == "completed", result.get("error")
    assert all(set(a["votes"]) == {"42"} for a in result["answers"]), result["answers"]
    assert bad.state.requests > 0
    outcomes = _outcomes(accounting, bad)
    assert outcomes["failed"] == outcomes["dispatched"] == bad.state.requests
    assert outcomes.get("cancelled", 0) == 0


@pytest.mark.parametrize("shape", list(MALFORMED))
def test_a_malformed_chunk_from_the_only_replica_fails_cleanly(
    fakes: Callable[..., FakeServer], shape: str
) -> None:
    upstream = fakes("malformed", bad_chunk=MALFORMED[shape])
    with _serve(upstream, stream=True) as live:
        reply = _chat(live.url)
        solved = _solve(live.url, [_question("q")], 4)
        accounting = assert_accounting(live.url, [upstream.url])
    assert reply.status_code == 502, reply.text
    assert "not a completion chunk" in reply.json()["error"]["message"]
    assert solved.status_code == 200, solved.text
    assert solved.json()["status"] == "failed"
    assert "internal error" not in solved.json()["error"]
    outcomes = _outcomes(accounting, upstream)
    # Failed, not cancelled (a sample in flight when the job gave up is cancelled).
    assert outcomes["failed"] >= upstream.state.requests - 4 > 0
    assert outcomes.get("completed", 0) == 0


# --- item: an error reported mid-stream; events over several lines --------------------------


def test_an_error_reported_mid_stream_never_votes(fakes: Callable[..., FakeServer]) -> None:
    """vLLM's ``data: {"error": ...}`` then ``data: [DONE]``: its partial text was a sample
    (finish reason None) and voted."""
    upstream = fakes("failing", stream_error=True, target=POISON, answers=("7",))
    with _serve(upstream, stream=True) as live:
        solved = _solve(live.url, [_question("poison", POISON), _question("plain")], 8)
        poisoned = _chat(live.url, POISON)
        accounting = assert_accounting(live.url, [upstream.url])
    assert solved.status_code == 200, solved.text
    answers = {a["id"]: a for a in solved.json()["answers"]}
    assert answers["poison"]["samples"] == 0 and not answers["poison"]["votes"]
    assert answers["plain"]["answer"] == "7"
    assert poisoned.status_code in (502, 503), poisoned.text
    if poisoned.status_code == 502:
        assert "injected failure mid-stream" in poisoned.json()["error"]["message"]
    assert _outcomes(accounting, upstream)["failed"] > 0


def test_events_whose_data_spans_several_lines_are_read(
    fakes: Callable[..., FakeServer],
) -> None:
    """A spec-valid event of several ``data:`` lines failed every attempt as "not JSON"."""
    upstream = fakes("multiline", multiline_data=True)
    with _serve(upstream, stream=True) as live:
        solved = _solve(live.url, [_question("q0"), _question("q1")], 8)
        accounting = assert_accounting(live.url, [upstream.url])
    assert solved.status_code == 200, solved.text
    result = solved.json()
    assert result["status"] == "completed", result.get("error")
    assert [a["answer"] for a in result["answers"]] == ["42", "42"]
    assert _outcomes(accounting, upstream).get("failed", 0) == 0
