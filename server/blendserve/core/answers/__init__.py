"""Answer extraction and canonical voting keys, the pure part (no processes, no I/O).

The guarded public API (deadlines, worker processes, cache, asyncio) is
:mod:`blendserve.answers`; :func:`sympy_key` here has no time limit of its own.
"""

from blendserve.core.answers.extract import (
    KINDS,
    REGEX_TIMEOUT_S,
    AnswerKind,
    RegexTimeout,
    RegexUnavailable,
    check_kind,
    extract,
    search_re,
    search_regex,
)
from blendserve.core.answers.math_keys import (
    MAX_SYMPY_CHARS,
    is_safe_for_sympy,
    plain_number_key,
    sympy_key,
)
from blendserve.core.answers.normalize import (
    MAX_KEY_CHARS,
    bounded_key,
    choice_key,
    clean_math,
    exact_key,
    is_text_answer,
    math_fallback_key,
    number_key,
    scan_boxes,
)
from blendserve.core.answers.thoughts import (
    DEFAULT_REASONING_TAGS,
    ReasoningTags,
    Thought,
    read_thought,
)

__all__ = [
    "DEFAULT_REASONING_TAGS",
    "KINDS",
    "MAX_KEY_CHARS",
    "MAX_SYMPY_CHARS",
    "REGEX_TIMEOUT_S",
    "AnswerKind",
    "ReasoningTags",
    "RegexTimeout",
    "RegexUnavailable",
    "Thought",
    "bounded_key",
    "check_kind",
    "choice_key",
    "clean_math",
    "exact_key",
    "extract",
    "is_safe_for_sympy",
    "is_text_answer",
    "math_fallback_key",
    "number_key",
    "plain_number_key",
    "read_thought",
    "scan_boxes",
    "search_re",
    "search_regex",
    "sympy_key",
]
