"""Answer extraction and canonical voting keys: the library API and a job's keyer.

Samples that give one answer in different forms (``\\frac12``, ``0.5``) share a
key, and a truncated sample, or one whose thought never closed, abstains.
``math`` and ``auto`` keys come from sympy, run in worker processes under a
deadline so that no answer can hang a caller, cached per distinct answer and
shared fairly between owners (:class:`KeyOwner`); the ``a``-functions and the
keyers never block an event loop. The module functions share one default
:class:`AnswerKeys`; a service may hold its own. docs/policies.md has the rules.
"""

from __future__ import annotations

from blendserve.answers._keys import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_DEADLINE_S,
    AnswerKeys,
    CacheInfo,
    KeyOwner,
    SampleKeyer,
)
from blendserve.core.answers import (
    DEFAULT_REASONING_TAGS,
    KINDS,
    AnswerKind,
    ReasoningTags,
    Thought,
    read_thought,
)

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_DEADLINE_S",
    "DEFAULT_REASONING_TAGS",
    "KINDS",
    "AnswerKeys",
    "AnswerKind",
    "CacheInfo",
    "KeyOwner",
    "ReasoningTags",
    "SampleKeyer",
    "Thought",
    "acanonical_key",
    "aextract",
    "cache_info",
    "canonical_key",
    "clear_cache",
    "configure",
    "default_keys",
    "extract",
    "make_keyer",
    "read_thought",
    "shutdown",
    "warm_up",
]

_default = AnswerKeys()


def default_keys() -> AnswerKeys:
    """The state the module functions use."""
    return _default


def configure(
    *,
    deadline_s: float | None = None,
    workers: int | None = None,
    cache_bytes: int | None = None,
) -> None:
    """Changes the math key settings; a new worker count restarts the pool.

    Args:
        deadline_s: seconds one answer may spend in sympy (default 2).
        workers: worker processes (default 1).
        cache_bytes: bytes each key cache holds, counting answers and keys (default 16 MiB).
    """
    _default.configure(deadline_s=deadline_s, workers=workers, cache_bytes=cache_bytes)


def warm_up() -> None:
    """Starts the worker processes now (e.g. at service start) instead of on first use."""
    _default.warm_up()


def shutdown() -> None:
    """Stops the worker processes and the executor; both restart lazily if used again."""
    _default.shutdown()


def clear_cache() -> None:
    """Forgets every cached math key and zeroes the counters."""
    _default.clear_cache()


def cache_info() -> CacheInfo:
    """Counters of the math key cache."""
    return _default.cache_info()


def extract(
    text: str,
    kind: AnswerKind,
    pattern: str | None = None,
    *,
    reasoning_tags: ReasoningTags = DEFAULT_REASONING_TAGS,
) -> str | None:
    """The final answer of one sample, or None when it abstains (no answer, truncated).

    A reasoning model's thought is never read: ``<think>3+4 is maybe \\boxed{8}</think>
    The answer is 7.`` gives ``7`` in every kind, and a thought that never closed abstains.

    Args:
        text: the sample's completion text.
        kind: ``auto``, ``number``, ``math``, ``choice``, ``regex`` or ``exact``.
        pattern: the ``regex`` kind's pattern (first group, else the whole match).
        reasoning_tags: the model's thought markers (``<think>``, ``</think>``).

    Raises:
        ValueError: unknown kind, or a ``regex`` kind without a valid pattern.
    """
    return _default.extract(text, kind, pattern, reasoning_tags=reasoning_tags)


async def aextract(
    text: str,
    kind: AnswerKind,
    pattern: str | None = None,
    *,
    reasoning_tags: ReasoningTags = DEFAULT_REASONING_TAGS,
) -> str | None:
    """:func:`extract` for an event loop: a ``regex`` search runs off the loop's thread."""
    return await _default.aextract(text, kind, pattern, reasoning_tags=reasoning_tags)


def canonical_key(answer: str, kind: AnswerKind) -> str:
    """The voting key of an extracted answer: equivalent answers share it.

    ``number``: Decimal form (``1,000``, ``$1000.00`` -> ``1000``; ``50%`` -> ``50``).
    ``math``/``auto``: a canonical sympy form (``\\frac12``, ``0.5`` -> ``1/2``; sets
    order-free; ``x = 5`` -> ``5``), plain words lower-cased, and a normalised
    string when sympy is unsafe, fails or misses the deadline. ``choice``: the
    upper-case letter. ``exact``/``regex``: the trimmed, whitespace-folded text.
    May block up to the deadline for an uncached ``math`` key.

    Raises:
        ValueError: unknown kind.
    """
    return _default.canonical_key(answer, kind)


async def acanonical_key(answer: str, kind: AnswerKind) -> str:
    """:func:`canonical_key` for an event loop: sympy work runs off the loop's thread."""
    return await _default.acanonical_key(answer, kind)


def make_keyer(
    kind: AnswerKind,
    pattern: str | None = None,
    keys: AnswerKeys | None = None,
    *,
    reasoning_tags: ReasoningTags = DEFAULT_REASONING_TAGS,
) -> SampleKeyer:
    """``text -> (answer, key)`` for one job's samples, off the event loop (a scheduler's keyer).

    Each keyer is its own owner of the sympy workers' time; ``keys`` holds the
    workers and cache (None: the module's default), ``pattern`` is the ``regex``
    kind's, and a thought within ``reasoning_tags`` never votes.

    Raises:
        ValueError: unknown kind, or a ``regex`` kind without a valid pattern.
    """
    return (keys if keys is not None else _default).keyer(kind, pattern, reasoning_tags)
