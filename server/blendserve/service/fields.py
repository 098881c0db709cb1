"""The base of request schemas: JSON ``true`` is not the number 1, nor ``"yes"`` a boolean.

pydantic's lax mode would read ``"seed": false`` as 0 and ``"yes"`` as true; a
client that sends them has a bug worth a 422 naming the field, not a quiet guess.
"""

from __future__ import annotations

import types
from functools import cache
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationInfo, field_validator

__all__ = ["RequestModel"]


def _is_of(annotation: Any, kinds: tuple[type, ...]) -> bool:
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_of(arg, kinds) for arg in get_args(annotation))
    return annotation in kinds


@cache
def _number_fields(model: type[BaseModel]) -> frozenset[str]:
    fields = model.model_fields.items()
    return frozenset(name for name, field in fields if _is_of(field.annotation, (int, float)))


@cache
def _boolean_fields(model: type[BaseModel]) -> frozenset[str]:
    fields = model.model_fields.items()
    return frozenset(name for name, field in fields if _is_of(field.annotation, (bool,)))


class RequestModel(BaseModel):
    """A request schema whose number fields refuse booleans, and boolean fields all else."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_lax_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name in _number_fields(cls):
            raise ValueError("a number is required, not a boolean")
        if (
            value is not None
            and not isinstance(value, bool)
            and info.field_name in _boolean_fields(cls)
        ):
            raise ValueError("a boolean is required (true or false)")
        return value
