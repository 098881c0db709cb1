"""The limits a hostile-user probe found missing: deep nesting, tokenizer routes outside
admission, unbounded pass-through replies, seeds past 64 bits, and an upstream that asks
for ``Retry-After: 2`` on every request.

A real uvicorn server on loopback, over the replay engine or the OpenAI engine in front
of the fake upstream (:mod:`blendserve.testing.fake_openai`, a real HTTP server).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from blendserve.engines.base import UpstreamReply
from blendserve.engines.config import RetryPolicy
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.openai.wire import once
from blendserve.engines.replay import ReplayEngine
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import LiveServer, serve_engine
from blendserve.testing.waiting import wait_until

from tests.support.errors import error_body

pytestmark = pytest.mark.slow

RECORDS = [
    {"id": str(i), "prompt": f"What is {i} plus one?", "answers": [str(i + 1)] * 3 + ["0"]}
    for i in range(6)
]
OFF = {"blendserve": {"enabled": False}}
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}
DEPTHS = [10, 100, 500, 1000, 5000]
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # vLLM's seeds: 64-bit signed


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer(FakeState(name="up", answers=("42",), tokenizer=True)).start()
    try:
        yield server
    finally:
        server.kill()


# --- deep nesting: a 422 naming the field, never a traceback ----------------------------


class _Tracebacks(logging.Handler):
    """Counts log records that carry a traceback."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.exc_text:
            self.count += 1


@pytest.fixture(scope="module")
def tracebacks() -> Iterator[_Tracebacks]:
    handler = _Tracebacks()
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@pytest.fixture(scope="module", params=["online", "grouped"])
def replay(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    engine = ReplayEngine(RECORDS, seed=1)
    with serve_engine(engine, sc_mode=request.param) as live:
        yield live


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


#: (route, body with a ``%s`` where the nested value goes, the field named at fault)
NESTED = {
    "v1 extra field": (
        "/v1/chat/completions",
        '{"model": "replay", "messages": [{"role": "user", "content": "What is 1 plus one?"}],'
        ' "blendserve": {"answer": "number", "budget_per_question": 2}, "foo": %s}',
        "foo",
    ),
    "v1 pass-through": (
        "/v1/chat/completions",
        '{"model": "replay", "messages": [{"role": "user", "content": "What is 1 plus one?"}],'
        ' "blendserve": {"enabled": false}, "foo": %s}',
        "foo",
    ),
    "v1 completions": (
        "/v1/completions",
        '{"model": "replay", "prompt": "What is 1 plus one?", "foo": %s,'
        ' "blendserve": {"answer": "number", "budget_per_question": 2}}',
        "foo",
    ),
    "v1 blendserve options": (
        "/v1/chat/completions",
        '{"model": "replay", "messages": [{"role": "user", "content": "x"}],'
        ' "blendserve": {"foo": %s}}',
        "blendserve.foo",
    ),
    "v1 message field": (
        "/v1/chat/completions",
        '{"model": "replay", "messages": [{"role": "user", "content": "What is 1 plus one?",'
        ' "foo": %s}], "blendserve": {"answer": "number", "budget_per_question": 2}}',
        "messages.0.foo",
    ),
    "solve sampling extra": (
        "/solve",
        '{"questions": [{"id": "1", "prompt": "x"}], "budget": 2, "answer": {"kind": "number"},'
        ' "sampling": {"extra": {"foo": %s}}}',
        "sampling.extra.foo",
    ),
    "solve unknown field": (
        "/solve",
        '{"questions": [{"id": "1", "prompt": "x"}], "budget": 2, "foo": %s}',
        "foo",
    ),
}
#: Cases whose field is refused at any depth (an unknown field where none is allowed).
UNKNOWN_ANYWAY = {"v1 blendserve options", "solve unknown field"}


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("case", list(NESTED))
def test_a_field_nested_deep_is_a_422_naming_it_and_never_a_traceback(
    replay: LiveServer, tracebacks: _Tracebacks, case: str, depth: int
) -> None:
    path, template, param = NESTED[case]
    before = tracebacks.count
    response = httpx.post(
        f"{replay.url}{path}",
        content=(template % _nested(depth)).encode(),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    if depth <= 64 and case not in UNKNOWN_ANYWAY:
        assert response.status_code == 200, response.text
    else:
        error = error_body(response, 422)
        assert error["param"] == param
        if depth > 64:
            assert "nest more than 64 deep" in error["message"]
    assert tracebacks.count == before, "a traceback was logged"
    wait_until(lambda: replay.service.admission.jobs == 0, 10, "the slot given back")


def test_a_body_nested_at_the_limit_is_served(replay: LiveServer) -> None:
    # The body is level 1, "foo" level 2: 63 more arrays are the most it may hold.
    _, template, _ = NESTED["v1 extra field"]
    for depth, status in ((63, 200), (64, 422)):
        response = httpx.post(
            f"{replay.url}/v1/chat/completions",
            content=(template % _nested(depth)).encode(),
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert response.status_code == status, response.text


# --- tokenizer routes: admitted, with a body limit of their own -------------------------


class _GatedTokenizer(ReplayEngine):
    """A replay engine whose tokenizer endpoints answer once ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__(RECORDS, seed=1)
        self.gate = threading.Event()
        self.waiting = 0

    async def forward(self, path: str, body: Mapping[str, Any]) -> UpstreamReply | None:
        return None

    async def tokenizer(self, path: str, body: Mapping[str, Any] | None) -> UpstreamReply:
        self.waiting += 1
        await asyncio.to_thread(self.gate.wait, 60)
        return UpstreamReply(200, "application/json", once(b'{"tokens": [1, 2]}'))


def test_tokenizer_calls_over_the_job_limit_are_429_and_give_their_slots_back() -> None:
    engine = _GatedTokenizer()
    with serve_engine(engine, max_concurrent_jobs=3) as live, ThreadPoolExecutor(3) as pool:
        admission = live.service.admission

        def tokenize() -> int:
            body = {"prompt": "x"}
            return httpx.post(f"{live.url}/tokenize", json=body, timeout=60).status_code

        held = [pool.submit(tokenize) for _ in range(3)]
        wait_until(lambda: engine.waiting == 3, 10, "three tokenizer calls held")
        assert admission.jobs == 3
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
            refused = httpx.post(f"{live.url}{path}", json=body, timeout=10)
            error_body(refused, 429)
            assert "Retry-After" in refused.headers
        error_body(httpx.get(f"{live.url}/tokenizer_info", timeout=10), 429)
        assert httpx.get(f"{live.url}/health", timeout=10).status_code == 200
        engine.gate.set()
        assert [future.result(timeout=60) for future in held] == [200] * 3
        wait_until(lambda: admission.jobs == 0, 10, "the slots given back")
        assert httpx.post(f"{live.url}/tokenize", json={"prompt": "x"}, timeout=10).json() == {
            "tokens": [1, 2]
        }


@pytest.mark.parametrize("declared", [True, False])
def test_a_tokenizer_body_over_its_own_limit_is_413(fake: FakeServer, declared: bool) -> None:
    limit = 100_000
    engine = OpenAIEngine([fake.url])
    with serve_engine(engine, max_tokenizer_body_bytes=limit) as live:
        ids = json.dumps({"tokens": list(range(30_000))}).encode()  # about 200 KB
        assert len(ids) > limit
        content: bytes | Iterator[bytes] = ids if declared else iter([ids[:50_000], ids[50_000:]])
        response = httpx.post(
            f"{live.url}/detokenize",
            content=content,
            headers={"content-type": "application/json"},
            timeout=30,
        )
        error_body(response, 413)
        small = {"tokens": [104, 105]}
        served = httpx.post(f"{live.url}/detokenize", json=small, timeout=30)
        assert served.status_code == 200 and served.json()["prompt"] == "hi"
        # The other routes keep max_body_bytes.
        chat = {**CHAT, **OFF, "messages": [{"role": "user", "content": "x" * 2 * limit}]}
        passed = httpx.post(f"{live.url}/v1/chat/completions", json=chat, timeout=30)
        assert passed.status_code == 200, passed.text


@pytest.mark.parametrize("depth", [100, 1000, 5000])
def test_a_tokenizer_body_nested_deep_is_a_422(fake: FakeServer, depth: int) -> None:
    with serve_engine(OpenAIEngine([fake.url])) as live:
        response = httpx.post(
            f"{live.url}/tokenize",
            content=b'{"prompt": "x", "foo": %s}' % _nested(depth).encode(),
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert error_body(response, 422)["param"] == "foo"


# --- pass-through: samples bounded as a voted request's are --------------------------------

PASS_LIMITS = {"max_questions_per_job": 3, "max_budget_per_job": 40}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "n": 41}, "n"),
        ({"model": "fake-model", "prompt": ["a", "b"], "n": 21}, "n"),
        ({"model": "fake-model", "prompt": ["a", "b", "c", "d"]}, "prompt"),
        ({"model": "fake-model", "prompt": [[1], [2], [3], [4]]}, "prompt"),
    ],
)
def test_pass_through_over_the_job_limits_is_422_naming_the_field(
    fake: FakeServer, body: dict[str, Any], param: str
) -> None:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    with serve_engine(OpenAIEngine([fake.url]), **PASS_LIMITS) as live:
        response = httpx.post(f"{live.url}{path}", json={**body, **OFF}, timeout=30)
        assert error_body(response, 422)["param"] == param
        assert fake.state.requests == 0, "the request went upstream"
        at_limit = {**CHAT, "n": 40}
        if "prompt" in body:
            at_limit = {**body, "n": 20, "prompt": ["a", "b"]}
        served = httpx.post(f"{live.url}{path}", json={**at_limit, **OFF}, timeout=30)
        assert served.status_code == 200, served.text
        assert fake.state.requests == 1
        wait_until(lambda: live.service.admission.jobs == 0, 10, "the slot given back")


# --- seeds: 64-bit signed, shifted per sample within that range ------------------------------


@pytest.mark.parametrize(
    "seed", [SEED_MAX + 1, SEED_MIN - 1, int("9" * 4300)], ids=["2^63", "-2^63-1", "4300 digits"]
)
def test_a_seed_outside_64_bits_is_422(fake: FakeServer, seed: int) -> None:
    with serve_engine(OpenAIEngine([fake.url])) as live:
        solve = {"questions": [{"prompt": "x"}], "budget": 4, "sampling": {"seed": seed}}
        response = httpx.post(f"{live.url}/solve", json=solve, timeout=30)
        assert error_body(response, 422)["param"] == "sampling.seed"
        for extra in ({}, OFF):
            chat = {**CHAT, **extra, "seed": seed}
            response = httpx.post(f"{live.url}/v1/chat/completions", json=chat, timeout=30)
            assert error_body(response, 422)["param"] == "seed"
        assert fake.state.requests == 0


@pytest.mark.parametrize("seed", [SEED_MAX, SEED_MIN], ids=["2^63-1", "-2^63"])
def test_the_64_bit_ends_go_upstream_as_they_are_and_shifts_wrap(seed: int) -> None:
    state = FakeState(name="up", answers=("42",), honour_n=False)  # one seeded request a sample
    with FakeServer(state) as fake, serve_engine(OpenAIEngine([fake.url])) as live:
        solve = {
            "questions": [{"messages": CHAT["messages"]}],
            "budget": 6,
            "policy": "sc",  # the whole budget
            "answer": {"kind": "number"},
            "sampling": {"seed": seed},
        }
        response = httpx.post(f"{live.url}/solve", json=solve, timeout=30)
        assert response.status_code == 200 and response.json()["status"] == "completed"
        assert response.json()["answers"][0]["samples"] == 6
        sampled = [body["seed"] for body in state.bodies if body.get("max_tokens") != 1]
        passed = httpx.post(
            f"{live.url}/v1/chat/completions", json={**CHAT, **OFF, "seed": seed}, timeout=30
        )
        assert passed.status_code == 200, passed.text
    assert seed in sampled and len(set(sampled)) == len(sampled) >= 6
    assert all(SEED_MIN <= s <= SEED_MAX for s in sampled)
    wrapped = SEED_MIN if seed == SEED_MAX else SEED_MIN + 1
    assert wrapped in sampled
    assert state.bodies[-1]["seed"] == seed  # passed through as it is


# --- an upstream that asks for Retry-After: 2 on every request -------------------------------


@pytest.mark.parametrize("status", [429, 503])
def test_an_upstream_asking_to_retry_after_2_s_every_time_fails_the_request_in_seconds(
    fake: FakeServer, status: int
) -> None:
    fake.state.retry_after = "2"
    fake.state.retry_after_status = status
    # A short backoff: what is left is what Retry-After costs.
    engine = OpenAIEngine([fake.url], retry=RetryPolicy(backoff_base=0.01, max_retry_after=5))
    chat = {**CHAT, "blendserve": {"answer": "number", "budget_per_question": 8}}
    with serve_engine(engine) as live:
        start = time.monotonic()
        response = httpx.post(f"{live.url}/v1/chat/completions", json=chat, timeout=120)
        elapsed = time.monotonic() - start
    error_body(response, 503)
    # 6 s measured (the job's failure timeout is 5 s); 52 s when every retry waited 2 s.
    assert elapsed < 35, f"the request took {elapsed:.0f} s"


def test_a_retry_after_once_is_honoured_and_the_request_completes(fake: FakeServer) -> None:
    fake.state.retry_after = "1"
    fake.state.retry_after_status = 503
    fake.state.retry_after_count = 1
    engine = OpenAIEngine([fake.url], retry=RetryPolicy(backoff_base=0.01, max_retry_after=5))
    chat = {**CHAT, "blendserve": {"answer": "number", "budget_per_question": 2}}
    with serve_engine(engine) as live:
        response = httpx.post(f"{live.url}/v1/chat/completions", json=chat, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["blendserve"]["answer"] == "42"
    assert fake.state.retry_after_count == 0 and fake.state.requests >= 2
