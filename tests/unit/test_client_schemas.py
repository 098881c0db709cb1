"""The client's models are hand copies of the server's response schemas: they must agree.

Every response body the server's schemas can produce, as it goes on the wire,
must validate as the client's model and read back the same; and both sides
must name the same fields, so that a field added on one side fails here.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import asdict
from typing import Any, Union, get_args, get_origin

import httpx
import pytest
from blendserve.scheduler.events import ProgressEvent
from blendserve.service.errors import ErrorResponse
from blendserve.service.solve.schemas import (
    AnswerOut,
    BudgetOut,
    ConfidenceOut,
    SolveResponse,
    UsageOut,
)
from blendserve_client import models
from blendserve_client._request import raise_for_error
from blendserve_client.errors import APIError
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

#: server schema -> the client model that reads it.
PAIRS: list[tuple[type[Any], type[BaseModel]]] = [
    (ConfidenceOut, models.Confidence),
    (UsageOut, models.Usage),
    (AnswerOut, models.Answer),
    (BudgetOut, models.Budget),
    (ProgressEvent, models.Progress),
    (SolveResponse, models.SolveResult),
]


def _fields(cls: type[Any]) -> dict[str, Any]:
    """Field name -> type of a pydantic model or a dataclass."""
    if issubclass(cls, BaseModel):
        return {name: f.annotation for name, f in cls.model_fields.items()}
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _values(annotation: Any) -> st.SearchStrategy[Any]:
    """Any value of a field's type (finite floats: the server's numbers are finite)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and (
        issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)
    ):
        return _instances(annotation)
    if annotation is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if origin is list:
        return st.lists(_values(args[0]), max_size=3)
    if origin is dict:
        return st.dictionaries(_values(args[0]), _values(args[1]), max_size=3)
    if origin in (Union, types.UnionType):
        return st.one_of(*map(_values, args))
    return st.from_type(annotation)


def _instances(cls: type[Any]) -> st.SearchStrategy[Any]:
    """Instances of ``cls`` with every field drawn, defaulted ones included."""
    return st.builds(cls, **{name: _values(t) for name, t in _fields(cls).items()})


def _wire(instance: Any, exclude: set[str] | None = None) -> dict[str, Any]:
    """The JSON body the server sends for ``instance``."""
    if isinstance(instance, BaseModel):
        data = instance.model_dump(mode="json", exclude=exclude)
    else:
        data = asdict(instance)
    loaded: dict[str, Any] = json.loads(json.dumps(data))
    return loaded


@pytest.mark.parametrize(("server", "client"), PAIRS, ids=lambda cls: cls.__name__)
def test_field_sets_agree(server: type[Any], client: type[BaseModel]) -> None:
    assert set(_fields(server)) == set(client.model_fields)


@pytest.mark.parametrize(("server", "client"), PAIRS, ids=lambda cls: cls.__name__)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_client_reads_every_body(
    server: type[Any], client: type[BaseModel], data: st.DataObject
) -> None:
    body = _wire(data.draw(_instances(server)))
    assert client.model_validate(body).model_dump(mode="json") == body


@settings(max_examples=50, deadline=None)
@given(answer=_instances(AnswerOut), progress=_instances(ProgressEvent))
def test_client_reads_every_stream_event(answer: AnswerOut, progress: ProgressEvent) -> None:
    """As the server's SSE/NDJSON renderer sends them (the done event without answers)."""
    body = _wire(answer)
    assert models.parse_event("answer", body).model_dump(mode="json") == body
    body = _wire(progress)
    assert models.parse_event("progress", body).model_dump(mode="json") == body


@settings(max_examples=50, deadline=None)
@given(done=_instances(SolveResponse))
def test_client_reads_every_done_event(done: SolveResponse) -> None:
    body = _wire(done, exclude={"answers"})
    result = models.parse_event("done", body)
    assert isinstance(result, models.SolveResult)
    assert result.answers == []
    assert result.model_dump(mode="json", exclude={"answers"}) == body


@settings(max_examples=50, deadline=None)
@given(error=_instances(ErrorResponse), status=st.integers(400, 599))
def test_client_reads_every_error(error: ErrorResponse, status: int) -> None:
    body = _wire(error)
    if body["error"]["param"] is None:  # the server leaves it out
        del body["error"]["param"]
    with pytest.raises(APIError) as raised:
        raise_for_error(httpx.Response(status, json=body))
    assert raised.value.status_code == status
    assert raised.value.message == error.error.message
    assert raised.value.param == error.error.param
