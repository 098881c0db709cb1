"""The base of request schemas: JSON ``true`` is not the number 1.

pydantic's lax mode reads a boolean as ``1`` or ``0``; the OpenAPI schema
says ``integer`` or ``number``, and a client that sends ``"seed": false``
has a bug worth a 422 naming the field, not a quiet zero.
"""

from __future__ import annotations

import types
from functools import cache
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationInfo, field_validator

__all__ = ["RequestModel"]


def _is_number(annotation: Any) -> bool:
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_number(arg) for arg in get_args(annotation))
    return annotation in (int, float)


@cache
def _number_fields(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(
        name for name, field in model.model_fields.items() if _is_number(field.annotation)
    )


class RequestModel(BaseModel):
    """A request schema whose integer and number fields refuse booleans."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name in _number_fields(cls):
            raise ValueError("a number is required, not a boolean")
        return value
