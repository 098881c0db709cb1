"""The one grammar of method strings, ``name[:key=value,...]``: policies and the online rule.

Each option has a parser for its value and a pattern for schemas, so the
parser here is the only one, and a service's schema pattern is derived from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Option", "parse_spec", "spec_pattern"]


@dataclass(frozen=True)
class Option:
    """One ``key=value`` option: ``parse`` reads its value (ValueError on a bad one),
    ``pattern`` is the regular expression of the values a schema documents."""

    parse: Callable[[str], Any]
    pattern: str


def parse_spec(text: str, options: Mapping[str, Option]) -> tuple[str, dict[str, Any]]:
    """The name of ``name[:key=value,...]`` and its options, each parsed by its :class:`Option`.

    Raises:
        ValueError: an unknown option, or a value its parser refuses.
    """
    name, _, rest = text.strip().partition(":")
    parsed: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in options:
            raise ValueError(f"bad option {item!r} in {text!r} (known: {', '.join(options)})")
        try:
            parsed[key] = options[key].parse(value)
        except ValueError as exc:
            raise ValueError(f"bad value {value!r} for {key} in {text!r}") from exc
    return name, parsed


def spec_pattern(names: Iterable[str], options: Mapping[str, Option]) -> str:
    """A regular expression matching ``name[:key=value,...]`` for ``names`` and ``options``."""
    option = "(" + "|".join(f"{key}={o.pattern}" for key, o in options.items()) + ")"
    return rf"^({'|'.join(names)})(:{option}(,{option})*)?$"
