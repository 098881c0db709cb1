"""Text in a request body that cannot be sent on: lone surrogates, and the field holding one.

JSON may escape half of a UTF-16 surrogate pair (``"\\ud800"``), which UTF-8
cannot encode: such a string would fail each upstream request it is sent in,
so the body is a 422 naming the field first (:func:`unencodable_field`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["printable", "unencodable_field", "unencodable_message"]

Path = tuple[str | int, ...]


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def printable(text: str) -> str:
    """``text`` with each lone surrogate written as its escape (``\\ud800``), for a message."""
    return text.encode("utf-8", "backslashreplace").decode()


def unencodable_message() -> str:
    """What a 422 for a string holding a lone surrogate says."""
    return (
        "a lone surrogate (such as \\ud800) is not text: UTF-8 cannot encode it "
        "(send the pair, or the character itself)"
    )


def unencodable_field(value: Any) -> str | None:
    """The field of a parsed JSON ``value`` holding text UTF-8 cannot encode; None: none does.

    The field is named by its keys and indices joined by dots, as ``error.param``
    names fields (a key that is itself at fault is named with its escapes), the
    shallowest first; an empty string when ``value`` is such a string.
    """
    if isinstance(value, str):
        return None if _encodable(value) else ""
    if not isinstance(value, (dict, list)):
        return None
    pending: deque[tuple[Any, Path]] = deque([(value, ())])
    while pending:
        item, path = pending.popleft()
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in pairs:
            if isinstance(key, str) and not _encodable(key):
                return ".".join(map(str, (*path, printable(key))))
            if isinstance(child, str):
                if not _encodable(child):
                    return ".".join(map(str, (*path, key)))
            elif isinstance(child, (dict, list)):
                pending.append((child, (*path, key)))
    return None
