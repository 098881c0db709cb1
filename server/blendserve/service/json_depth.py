"""How deep a request body nests arrays and objects, and the field where it nests too deep.

Python's json module and everything that walks a parsed body recurse once per
level, so a deep body fails to parse or raises ``RecursionError`` later.
Bodies nested deeper than :data:`MAX_JSON_DEPTH` are a 422 naming the field:
:func:`deep_field` finds it without recursion after parsing, and
:func:`deep_field_in` on the bytes of a body too deep to parse at all.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import islice
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "deep_field", "deep_field_in", "depth_message"]

#: Levels of arrays and objects a request body may nest (the body itself is level 1).
MAX_JSON_DEPTH = 64
_PARAM_PARTS = 8  # a field named by at most this many keys and indices
_SCAN_TOKENS = 100_000  # a body's tokens read to name its field (some ms); then unnamed
_CONTAINERS = frozenset({dict, list})
# After escaped backslashes and quotes are dropped, a string is quotes around non-quotes.
_TOKENS = re.compile(rb'"[^"]*"|[\[\]{}]|[^"\[\]{}]+')

Path = tuple[str | int, ...]


def depth_message(limit: int = MAX_JSON_DEPTH) -> str:
    """What a 422 for a body nested too deep says."""
    return f"arrays and objects nest more than {limit} deep (at most {limit})"


def _param(path: Sequence[str | int]) -> str:
    """The field at ``path`` as ``error.param`` names it: down to its last key, 8 parts at most."""
    keyed = max((i + 1 for i, part in enumerate(path) if isinstance(part, str)), default=0)
    return ".".join(str(part) for part in path[: min(keyed, _PARAM_PARTS)])


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit``: a walk one level at a time, no paths."""
    level = [value] if type(value) in _CONTAINERS else []
    for _ in range(limit):
        below: list[Any] = []
        for item in level:
            children = item.values() if type(item) is dict else item
            if not _CONTAINERS.isdisjoint(map(type, children)):
                below += [child for child in children if type(child) in _CONTAINERS]
        if not below:
            return False
        level = below
    return True


def _path_below(value: Any, limit: int) -> Path:
    """The keys and indices down to a container nested deeper than ``limit`` (one is)."""
    pending: list[tuple[Any, Path]] = [(value, ())]
    while pending:
        item, path = pending.pop()
        if len(path) == limit:
            return path
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        pending += [(child, (*path, key)) for key, child in pairs if type(child) in _CONTAINERS]
    return ()


def deep_field(value: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
    """The field of a parsed JSON ``value`` that nests deeper than ``limit``; None: none does.

    The field is named by its keys and indices joined by dots, as ``error.param``
    names fields, down to the last key on the way (``foo`` for ``{"foo": [[...]]}``);
    an empty string when no key leads there.
    """
    if not _too_deep(value, limit):
        return None
    return _param(_path_below(value, limit))


def deep_field_in(body: bytes, limit: int = MAX_JSON_DEPTH) -> str | None:
    """:func:`deep_field` of a JSON body read as bytes (one too deep for ``json.loads``).

    Only the first 100,000 tokens are read: past them, an empty string (the
    body may nest too deep further on). Keys that hold escaped quotes or
    backslashes are named without them.
    """
    text = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    path: list[str | int] = []  # per open array or object: the index or key being read
    objects: list[bool] = []
    string = b""
    tokens = 0
    for match in islice(_TOKENS.finditer(text), _SCAN_TOKENS):
        tokens += 1
        token = match.group()
        head = token[:1]
        if head in (b"[", b"{"):
            if len(objects) == limit:
                return _param(path)
            objects.append(head == b"{")
            path.append("" if head == b"{" else 0)
        elif head in (b"]", b"}"):
            if objects:
                objects.pop()
                path.pop()
        elif head == b'"':
            string = token[1:-1]
        elif objects and objects[-1]:
            if b":" in token:  # the string before it was a key
                path[-1] = string.decode(errors="replace")
        elif objects:
            path[-1] = int(path[-1]) + token.count(b",")
    return "" if tokens == _SCAN_TOKENS else None
