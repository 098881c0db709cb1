"""The client's job options are typed copies of the server's ``/solve`` request: they must agree.

Every field of the request (but the questions and ``stream``, which the
calls set) is a client option of a matching JSON type, and the bodies the
client builds, by keyword or from a ``SolveOptions``, are requests the
server takes. A field added to the server's request fails here.
"""

from __future__ import annotations

import asyncio
import json
import typing
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import httpx
import pytest
from blendserve.service.solve.schemas import SolveRequest
from blendserve.service.vocabulary import AnswerFormat as ServerAnswerFormat
from blendserve.service.vocabulary import SamplingIn
from blendserve_client import AnswerFormat, AsyncClient, Client, Sampling, SolveOptions
from blendserve_client.options import AnswerKind, SolveFields, solve_options
from pydantic import BaseModel, ValidationError

#: Fields of the request that the client's calls set themselves.
CALL_FIELDS = {"questions", "stream"}
#: server request model -> the client's model of the same fields.
PAIRS: list[tuple[type[BaseModel], type[BaseModel]]] = [
    (SolveRequest, SolveOptions),
    (SamplingIn, Sampling),
    (ServerAnswerFormat, AnswerFormat),
]
SUMMARY = {
    "status": "completed",
    "answers": [],
    "usage": {"samples": 0, "prompt_tokens": 0, "completion_tokens": 0},
    "budget": {"total": 8, "spent": 0, "unspent": 8},
    "duration_s": 0.0,
}
#: The docs' call style: keyword arguments, a kind for the answer, a dict for sampling.
DOCS_KEYWORDS: dict[str, Any] = {"budget": 8, "answer": "number", "sampling": {"max_tokens": 64}}
DOCS_BODY = {
    "questions": [{"prompt": "What is 6 * 7?"}],
    "budget": 8,
    "answer": {"kind": "number"},
    "sampling": {"max_tokens": 64},
}


def _shapes(schema: dict[str, Any]) -> set[str]:
    """A property's JSON types, without null, its bounds or its docs (a model: ``object``)."""
    branches = schema.get("anyOf", [schema])
    shapes = set()
    for branch in branches:
        if branch.get("type") == "null":
            continue
        kept = {k: branch[k] for k in ("type", "items", "enum") if k in branch}
        shapes.add(json.dumps(kept or {"type": "object"}, sort_keys=True))
    return shapes


@pytest.mark.parametrize(("server", "client"), PAIRS, ids=lambda cls: cls.__name__)
def test_the_client_has_every_request_field_with_the_server_s_type(
    server: type[BaseModel], client: type[BaseModel]
) -> None:
    assert set(client.model_fields) == set(server.model_fields) - CALL_FIELDS
    server_schema = server.model_json_schema()["properties"]
    client_schema = client.model_json_schema()["properties"]
    for name in client.model_fields:
        assert _shapes(client_schema[name]) == _shapes(server_schema[name]), name


def test_the_keyword_arguments_are_the_options() -> None:
    assert set(typing.get_type_hints(SolveFields)) == set(SolveOptions.model_fields)
    assert typing.get_args(AnswerKind) == typing.get_args(
        ServerAnswerFormat.model_fields["kind"].annotation
    )


def _recording(bodies: list[dict[str, Any]]) -> Callable[[httpx.Request], httpx.Response]:
    """A fake service that keeps each ``/solve`` body and answers an empty job."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if body["stream"]:
            frame = f"event: done\ndata: {json.dumps(SUMMARY)}\n\n"
            return httpx.Response(200, text=frame, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=SUMMARY)

    return handle


def _every_call(options: SolveOptions | None, **fields: Any) -> list[dict[str, Any]]:
    """The bodies of ``solve``, ``stream`` and their async twins, ``stream`` dropped."""
    bodies: list[dict[str, Any]] = []
    handle = _recording(bodies)
    questions = ["What is 6 * 7?"]
    with Client(transport=httpx.MockTransport(handle)) as client:
        client.solve(questions, options, **fields)
        list(client.stream(questions, options, **fields))

    async def twins() -> None:
        async with AsyncClient(transport=httpx.MockTransport(handle)) as client:
            await client.solve(questions, options, **fields)
            _ = [event async for event in client.stream(questions, options, **fields)]

    asyncio.run(twins())
    assert [body.pop("stream") for body in bodies] == [False, True, False, True]
    return bodies


@pytest.mark.parametrize(
    ("options", "fields"),
    [
        (None, DOCS_KEYWORDS),
        (SolveOptions(budget=8, answer="number", sampling=Sampling(max_tokens=64)), {}),
        (SolveOptions(budget=2, answer=AnswerFormat(kind="math")), DOCS_KEYWORDS),
        (None, {**DOCS_KEYWORDS, "sampling": MappingProxyType({"max_tokens": 64})}),
        (None, {**DOCS_KEYWORDS, "answer": {"kind": "number"}}),
    ],
    ids=["keywords", "options", "keywords-over-options", "mapping", "answer-mapping"],
)
def test_every_call_sends_the_same_body_by_keyword_or_by_options(
    options: SolveOptions | None, fields: dict[str, Any]
) -> None:
    for body in _every_call(options, **fields):
        assert body == DOCS_BODY
        SolveRequest.model_validate(body)


def test_every_option_reaches_the_body_as_the_server_takes_it() -> None:
    sampling = {
        "temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "max_tokens": 64,
        "stop": ["\n\n"], "seed": 7, "extra": {"repetition_penalty": 1.1},
    }  # fmt: skip
    budgeted: dict[str, Any] = {
        "budget_per_question": 4, "policy": "asc:cap=16",
        "answer": {"kind": "regex", "pattern": "= (\\d+)"}, "sampling": sampling,
        "model": "m", "settle_delta": 0.1, "concurrency": 8, "in_flight_per_question": 0.5,
        "max_rounds": 2, "include_reasoning": True, "traces": "weighted:cut=10",
    }  # fmt: skip
    target = {"confidence": 0.95, "max_samples_per_question": 16}
    questions = [{"prompt": "What is 6 * 7?"}]
    for fields in (budgeted, {**budgeted, "budget_per_question": None, "budget": 12}):
        for body in _every_call(None, **fields):
            assert body == {"questions": questions, **{k: v for k, v in fields.items() if v}}
            SolveRequest.model_validate(body)
    # A quality target over budgeted options: None drops each budget field.
    for body in _every_call(SolveOptions(**budgeted), **{k: None for k in budgeted} | target):
        assert body == {"questions": questions, **target}
        SolveRequest.model_validate(body)
    covered = set(budgeted) | set(target) | {"budget"}
    assert covered == set(SolveOptions.model_fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"budgt": 8},
        {"budget": 8, "answer": "words"},
        {"budget": 8, "in_flight_per_question": "many"},
        {"budget": 8, "sampling": {"max_tokens": "long"}},
        {"budget": 8, "sampling": {"temprature": 0.5}},
        {"budget": 8, "answer": {"kind": "regex", "patern": "x"}},
    ],
)
def test_an_unknown_option_or_a_bad_type_is_refused_before_sending(
    fields: dict[str, Any],
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError("sent")

    with Client(transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(ValidationError):
            client.solve(["q"], **fields)
        with pytest.raises(ValidationError):
            list(client.stream(["q"], **fields))


def test_keywords_go_over_the_options_and_none_drops_one() -> None:
    base = SolveOptions(budget_per_question=4, answer="number")
    merged = solve_options(base, {"budget_per_question": None, "confidence": 0.9})
    assert merged.body(["q"], stream=True) == {
        "questions": [{"prompt": "q"}],
        "stream": True,
        "answer": {"kind": "number"},
        "confidence": 0.9,
    }
    assert base.budget_per_question == 4  # options are frozen: a call never changes them
