"""Schema fuzzing: schemathesis generates requests from the service's own OpenAPI schema.

Over 1,000 generated cases, valid ones and ones the schema forbids, go to a
real uvicorn server on loopback (replay engine, zero latency, small job
limits). No response may be a 5xx, and each response's status code, content
type and body must be the ones the schema declares for it.
"""

from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from blendserve.engines.base import GenerateRequest, Sample
from blendserve.engines.replay import ReplayEngine
from blendserve.service import Settings, create_app
from blendserve.testing.live import LiveServer
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.slow

KEY = "fuzz-key"
MAX_QUESTIONS = 8
MAX_BUDGET = 64
MAX_PER_QUESTION = 16
AUTH = {"Authorization": f"Bearer {KEY}"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# (method, path, generation mode, cases): 1,252 in all, and 200 more in
# test_generated_jobs_run. An operation without parameters has exactly one
# case, and none that the schema forbids.
PLAN = [
    ("GET", "/health", GenerationMode.POSITIVE, 1),
    ("GET", "/v1/models", GenerationMode.POSITIVE, 1),
    ("POST", "/solve", GenerationMode.POSITIVE, 250),
    ("POST", "/solve", GenerationMode.NEGATIVE, 100),
    ("POST", "/v1/chat/completions", GenerationMode.POSITIVE, 200),
    ("POST", "/v1/chat/completions", GenerationMode.NEGATIVE, 100),
    ("POST", "/v1/completions", GenerationMode.POSITIVE, 200),
    ("POST", "/v1/completions", GenerationMode.NEGATIVE, 100),
]


class _EveryQuestionReplay(ReplayEngine):
    """The replay engine answering every question, whatever its id or prompt, from one
    recorded distribution (generated questions match no recorded one)."""

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        async for sample in super().replay_stream(replace(request, question_id="any"), kind):
            yield sample


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    async def factory() -> ReplayEngine:
        return _EveryQuestionReplay([{"id": "any", "answers": ["1", "2", "1", None]}], seed=3)

    # Small limits keep every generated job short: the schema allows huge budgets.
    config = Settings(
        api_keys=(KEY,),
        max_questions_per_job=MAX_QUESTIONS,
        max_budget_per_job=MAX_BUDGET,
        max_budget_per_question=MAX_PER_QUESTION,
        max_prompt_bytes=4096,
        max_body_bytes=256 * 1024,
        default_concurrency=8,
        group_wait_ms=0,
        sc_budget_per_question=4,
    )
    with LiveServer(create_app(config, engine_factory=factory)) as live:
        yield live


@pytest.fixture(scope="module")
def schema(server: LiveServer) -> Any:
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=AUTH)


def _fuzz(server: LiveServer, strategy: Any, cases: int) -> list[int]:
    """Sends ``cases`` generated requests and checks each response; their statuses."""
    statuses: list[int] = []

    @settings(
        max_examples=cases,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(case: Any) -> None:
        response = case.call(base_url=server.url, session=session, headers=AUTH, timeout=30)
        statuses.append(response.status_code)
        case.validate_response(response, checks=CHECKS)

    with requests.Session() as session:
        run()
    assert len(statuses) >= cases
    return statuses


@pytest.mark.parametrize(
    ("method", "path", "mode", "cases"),
    PLAN,
    ids=[f"{m} {p} {mode.value}" for m, p, mode, _ in PLAN],
)
def test_generated_requests_conform(
    server: LiveServer, schema: Any, method: str, path: str, mode: GenerationMode, cases: int
) -> None:
    statuses = _fuzz(server, schema[path][method].as_strategy(generation_mode=mode), cases)
    if mode is GenerationMode.NEGATIVE:
        refused = sum(400 <= status < 500 for status in statuses)
        assert refused >= 0.9 * len(statuses), f"forbidden requests served: {Counter(statuses)}"
    elif method == "POST":
        served = statuses.count(200)
        assert served >= cases // 20, f"too few generated requests served: {Counter(statuses)}"


# Bodies once answered with a 500 or a body outside the schema (most found by the fuzzer).
HOSTILE = [
    ("/solve", '{"questions":[{"prompt":"a"},{"prompt":"b"}],"budget_per_question":1e308}',
     422, "budget_per_question"),
    ("/solve", '{"questions":[{"prompt":"a"}],"budget_per_question":Infinity}',
     422, "budget_per_question"),
    ("/solve", '{"questions":[{"prompt":"a"}],"budget":4,"sampling":{"top_p":NaN}}',
     422, "sampling.top_p"),
    ("/solve", '{"questions":[{"prompt":"a"}],"budget":4,"policy":"esc:window=0"}', 422, "policy"),
    ("/solve", '{"questions":[{"prompt":"a"}],"budget":4,"policy":"asc:cap=0"}', 422, "policy"),
    ("/solve", '{"questions":[{"prompt":"a"}],"budget":4,"policy":"asc:cap=nan"}', 422, "policy"),
    ("/solve", '{"questions":[{"prompt":"a"}],"budget":4,"answer":{"kind":"regex","pattern":"("}}',
     422, "answer"),
    ("/solve", '{"questions":[{"prompt":"a"}],"budget":4,"answer":{"kind":"regex","pattern":""}}',
     422, "answer.pattern"),
    ("/v1/completions", '{"prompt":"a","blendserve":{"policy":"esc:window=0"}}',
     422, "blendserve.policy"),
    ("/v1/chat/completions",
     '{"messages":[{"role":"user","content":"a"}],"blendserve":{"answer":{"kind":"regex",'
     '"pattern":"("}}}', 422, "blendserve.answer"),
    ("/solve", b'{"questions": "\xff\xfe"}', 400, None),
    ("/solve", '{"questions":[{"prompt":"a"}],"budget":true}', 422, "budget"),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"a"}],"seed":false}',
     422, "seed"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "param"), HOSTILE)
def test_hostile_bodies_get_a_clear_4xx(
    server: LiveServer, schema: Any, path: str, body: str | bytes, status: int, param: str | None
) -> None:
    content = body.encode() if isinstance(body, str) else body
    headers = {**AUTH, "Content-Type": "application/json"}
    response = httpx.post(f"{server.url}{path}", content=content, headers=headers, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["message"]
    assert error.get("param") == param
    case = schema[path]["POST"].Case(body={})
    case.validate_response(response, checks=CHECKS)


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status"),
    [
        ("POST", "/solve", {}, {"questions": [{"prompt": "a"}], "budget": 1}, 401),
        ("GET", "/v1/models", {"Authorization": "Bearer wrong"}, None, 401),
        ("POST", "/solve", AUTH, {"questions": [{"prompt": "a" * 300_000}], "budget": 1}, 413),
        ("POST", "/v1/completions", AUTH, {"prompt": "a" * 5000}, 422),
    ],
)
def test_refusals_are_declared_errors(
    server: LiveServer,
    schema: Any,
    method: str,
    path: str,
    headers: dict[str, str],
    body: dict[str, Any] | None,
    status: int,
) -> None:
    response = httpx.request(method, f"{server.url}{path}", json=body, headers=headers, timeout=30)
    assert response.status_code == status, response.text
    assert response.json()["error"]["message"]
    operation = schema[path][method]
    case = operation.Case(body=body) if body is not None else operation.Case()
    case.validate_response(response, checks=CHECKS)


def test_unknown_routes_answer_in_the_error_shape(server: LiveServer) -> None:
    missing = httpx.get(f"{server.url}/nowhere", headers=AUTH)
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "Not Found",
        "type": "invalid_request_error",
        "code": 404,
    }
    wrong_method = httpx.get(f"{server.url}/solve", headers=AUTH)
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert wrong_method.json()["error"]["code"] == 405


def _within_limits(case: Any) -> Any:
    """The case with at most the server's questions and budget, so that its job runs.

    The schema cannot say that a quality target excludes the budget fields (a
    422 naming the field): the target's cases drop them, so they run too.
    """
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("questions"), list):
        body["questions"] = body["questions"][:MAX_QUESTIONS]
        count = len(body["questions"])
        most = min(MAX_BUDGET, MAX_PER_QUESTION * count)
        budget = body.get("budget")
        if isinstance(budget, (int, float)) and not isinstance(budget, bool):
            body["budget"] = max(count, min(int(budget), most))
        per_question = body.get("budget_per_question")
        if isinstance(per_question, (int, float)) and not isinstance(per_question, bool):
            body["budget_per_question"] = max(1.0, min(per_question, most / max(count, 1)))
        if body.get("confidence") is not None:  # a quality target: no budget fields
            for name in ("budget", "budget_per_question", "policy", "settle_delta"):
                body.pop(name, None)
            body.pop("in_flight_per_question", None)
        if body.get("confidence") is not None and count:  # its cap times the questions
            cap = body.get("max_samples_per_question")
            cap = cap if isinstance(cap, int) and not isinstance(cap, bool) else 64
            body["max_samples_per_question"] = max(1, min(cap, most // count))
    return case


def test_generated_jobs_run(server: LiveServer, schema: Any) -> None:
    """Generated /solve requests within the job limits: most run, all conform."""
    strategy = schema["/solve"]["POST"].as_strategy().map(_within_limits)
    statuses = _fuzz(server, strategy, 200)
    assert statuses.count(200) >= 120, Counter(statuses)
