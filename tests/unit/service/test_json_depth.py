"""The field where a request body nests too deep, from the parsed body or its bytes."""

from __future__ import annotations

import json

import pytest
from blendserve.service.json_depth import MAX_JSON_DEPTH, deep_field, deep_field_in


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('{"foo": %s}', "foo"),
        ('{"a": 1, "b": {"c": [1, "x]", {"d": %s}]}}', "b.c.2.d"),
        (
            '{"a": ["{", "\\"["], "messages": [{"role": "user", "content": %s}]}',
            "messages.0.content",
        ),
        ('{"k\\"ey": %s}', 'k"ey'),  # from its bytes: "key", without the escaped quote
        ('{"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a": %s}}}}}}}}}', "a.a.a.a.a.a.a.a"),
        ("[%s]", ""),
    ],
)
def test_the_field_nested_too_deep_is_named(body: str, param: str) -> None:
    deep = body % _nested(100)
    assert deep_field(json.loads(deep)) == param
    assert deep_field_in(deep.encode()) == param.replace('"', "")


def test_a_body_at_the_limit_is_not_too_deep() -> None:
    body = f'{{"foo": {_nested(MAX_JSON_DEPTH - 1)}}}'
    assert deep_field(json.loads(body)) is None and deep_field_in(body.encode()) is None
    deeper = f'{{"foo": {_nested(MAX_JSON_DEPTH)}}}'
    assert deep_field(json.loads(deeper)) == "foo" == deep_field_in(deeper.encode())


def test_wide_bodies_and_token_ids_are_not_deep() -> None:
    body = {"prompt": [list(range(1000))] * 100, "questions": [{"messages": [{"a": 1}]}] * 1000}
    assert deep_field(body) is None
    assert deep_field_in(json.dumps(body).encode()) is None


def test_a_body_deep_past_the_tokens_read_is_unnamed() -> None:
    body = b'{"a": [' + b"1, [], " * 100_000 + b'1], "foo": ' + _nested(100).encode() + b"}"
    assert deep_field_in(body) == ""
