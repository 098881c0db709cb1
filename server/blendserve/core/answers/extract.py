"""Answer extraction per kind: the final answer of a sample, or None to abstain.

What each kind of :data:`KINDS` reads is on docs/policies.md ("Answers"). Every kind
reads the final answer, never a thought (:mod:`.thoughts`): a sample whose thought
never closed abstains. An unclosed last box means a truncated sample: every kind but
``regex`` and ``exact`` abstains on it. Every pattern here is linear in the input.
"""

from __future__ import annotations

import importlib
import re
from collections import deque
from functools import lru_cache
from typing import Any, Literal, get_args

from blendserve.core.answers.normalize import NUMBER_RE, fold_ws, scan_boxes, unwrap_box
from blendserve.core.answers.thoughts import DEFAULT_REASONING_TAGS, ReasoningTags, read_thought

_regex_module: Any
try:  # the third-party ``regex`` module: like ``re``, with a timeout
    _regex_module = importlib.import_module("regex")
except ImportError:  # pragma: no cover - depends on the environment
    _regex_module = None

__all__ = [
    "KINDS",
    "REGEX_TIMEOUT_S",
    "AnswerKind",
    "RegexTimeout",
    "RegexUnavailable",
    "check_kind",
    "extract",
    "pattern_size",
    "search_re",
    "search_regex",
]

#: How a sample's answer is read (docs/policies.md, "Answers").
AnswerKind = Literal["auto", "number", "math", "choice", "regex", "exact"]
#: Every answer kind ``extract`` and ``canonical_key`` accept.
KINDS: tuple[AnswerKind, ...] = get_args(AnswerKind)

#: Time limit of one ``regex`` kind search (one sample): a backtracking pattern
#: costs at most this much CPU a sample, and the sample abstains.
REGEX_TIMEOUT_S = 0.25

#: Largest size of a ``regex`` kind pattern, counted as :func:`pattern_size` does:
#: the ``regex`` module unrolls counted repeats when it compiles, so
#: ``(a{10000}){700}`` would cost seconds and gigabytes, while a pattern of this
#: size compiles in a negligible time.
MAX_PATTERN_SIZE = 2_000
_COUNTED = re.compile(r"\{(\d*)(?:,(\d*))?\}")

#: Only this many characters after "the answer is" are read.
_TAIL_CHARS = 300

_ANSWER_IS_RE = re.compile(r"(?i:answer)\s*(?:(?i:is)\b|:)")
_FINAL_ANSWER_RE = re.compile(r"(?i:final\s+answer)\s*(?:(?i:is)\b|:)")
_CHOICE_LETTER = r"(?:\(\s*([A-Ja-j])\s*\)|\[\s*([A-Ja-j])\s*\]|([A-J]))"
_CHOICE_PHRASE_RE = re.compile(
    r"(?i:answer|option|choice)(?:\s+(?i:is|would\s+be|should\s+be|must\s+be))?(?![A-Za-z])"
)
_CHOICE_LEAD_RE = re.compile(r"(?i:(?:option|choice)(?![A-Za-z])|\\text(?:bf)?\{)")
_CHOICE_START_RE = re.compile(_CHOICE_LETTER + r"(?![A-Za-z0-9'\u2019])")
_CHOICE_ALONE_RE = re.compile(
    r"^[\s*_#>:.$]*(?:(?i:answer)\s*:?\s*)?[*_]*" + _CHOICE_LETTER + r"[\s*_.)$]*$"
)
_CHOICE_BOX_RE = re.compile(r"^\s*(?:\\text\{|\\textbf\{|\\mathrm\{)?\s*" + _CHOICE_LETTER)


class RegexUnavailable(RuntimeError):
    """The ``regex`` module is missing, so a pattern cannot be run with a timeout here."""


class RegexTimeout(TimeoutError):
    """A ``regex`` kind search ran past its time limit: the sample abstains."""


def check_kind(kind: str) -> None:
    """Raises ``ValueError`` naming ``kind`` unless it is one of :data:`KINDS`."""
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; expected one of {', '.join(KINDS)}")


def _number_in(text: str, last: bool = False) -> str | None:
    """The first (or last) number token of ``text``, without currency or spaces."""
    found = _last_match(NUMBER_RE, text) if last else NUMBER_RE.search(text)
    if found is None:
        return None
    sign = "-" if (found.group("neg") or found.group("neg2")) else ""
    den = found.group("den")
    return sign + found.group("num") + (found.group("exp") or "") + (f"/{den}" if den else "")


def _line_after(text: str, start: int) -> str:
    tail = text[start : start + _TAIL_CHARS]
    end = tail.find("\n")
    return tail if end < 0 else tail[:end]


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    tail = deque(pattern.finditer(text), maxlen=1)
    return tail[0] if tail else None


def _phrase_answer(text: str, start: int) -> str | None:
    """The answer written right after "answer is" at ``start``: ``$...$`` or the line."""
    tail = text[start : start + _TAIL_CHARS].lstrip(" \t*:")
    for opener, closer in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if tail.startswith(opener):
            end = tail.find(closer, len(opener))
            if end > len(opener):
                return tail[len(opener) : end].strip() or None
    line = tail.split("\n", 1)[0].strip().rstrip(".").strip(" *")
    if line.startswith("\\boxed") or line.startswith("\\fbox"):
        line = unwrap_box(line)
    return line or None


def _number_from_box(content: str) -> str | None:
    content = content.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    frac = re.search(r"\\frac\{(-?[\d,.]+)\}\{([\d,.]+)\}", content)
    if frac is not None:
        content = content.replace(frac.group(), f"{frac.group(1)}/{frac.group(2)}")
    if "=" in content:
        content = content.rsplit("=", 1)[1]
    return _number_in(content)


def _extract_number(text: str) -> str | None:
    box = scan_boxes(text)
    if box.unclosed:
        return None
    hashes = text.rfind("####")
    if hashes >= 0:
        found = _number_in(_line_after(text, hashes + 4))
        if found is not None:
            return found
    answer_is = _last_match(_ANSWER_IS_RE, text)
    if answer_is is not None:
        found = _number_in(_line_after(text, answer_is.end()))
        if found is not None:
            return found
    if box.content is not None:
        found = _number_from_box(box.content)
        if found is not None:
            return found
    return _number_in(text, last=True)


def _extract_math(text: str) -> str | None:
    box = scan_boxes(text)
    if box.unclosed:
        return None
    if box.content is not None:
        return unwrap_box(box.content).strip() or None
    final = _last_match(_FINAL_ANSWER_RE, text)
    if final is not None:
        return _phrase_answer(text, final.end())
    return None


def _extract_auto(text: str) -> str | None:
    box = scan_boxes(text)
    if box.unclosed:
        return None
    if box.content is not None:
        return unwrap_box(box.content).strip() or None
    hashes = text.rfind("####")
    if hashes >= 0:
        line = _line_after(text, hashes + 4)
        return _number_in(line) or (line.strip() or None)
    answer_is = _last_match(_ANSWER_IS_RE, text)
    if answer_is is not None:
        found = _phrase_answer(text, answer_is.end())
        if found is not None:
            return found
    return _number_in(text, last=True)


def _letter(match: re.Match[str]) -> str:
    return next(group for group in match.groups() if group).upper()


def _last_choice_phrase(text: str) -> tuple[int, str] | None:
    """The last "answer is (C)"-like phrase: position and letter.

    The text after the keyword is stripped procedurally rather than with
    overlapping regex quantifiers, which could backtrack on long runs of spaces.
    """
    found: tuple[int, str] | None = None
    for match in _CHOICE_PHRASE_RE.finditer(text):
        tail = text[match.end() : match.end() + 40].lstrip(" \t*_:\uff1a$")
        for _ in range(2):
            lead = _CHOICE_LEAD_RE.match(tail)
            if lead is not None:
                tail = tail[lead.end() :].lstrip(" \t*_:$")
        letter = _CHOICE_START_RE.match(tail)
        if letter is not None:
            found = (match.start(), _letter(letter))
    return found


def _extract_choice(text: str) -> str | None:
    best: tuple[int, str] | None = None
    box = scan_boxes(text)
    if box.unclosed:
        return None
    if box.content is not None:
        inner = _CHOICE_BOX_RE.match(box.content)
        if inner is not None and not box.content[inner.end() :].strip(" })."):
            best = (box.start, _letter(inner))
    phrase = _last_choice_phrase(text)
    if phrase is not None and (best is None or phrase[0] > best[0]):
        best = phrase
    stripped = text.rstrip()
    newline = stripped.rfind("\n")
    last_line = stripped[newline + 1 :]
    if len(last_line) <= 40:
        alone = _CHOICE_ALONE_RE.match(last_line)
        if alone is not None and (best is None or newline + 1 > best[0]):
            best = (newline + 1, _letter(alone))
    return best[1] if best is not None else None


def pattern_size(pattern: str) -> int:
    """Items of ``pattern`` once its counted repeats are unrolled: ``(ab){3}x{2,5}`` is 11.

    An upper bound (alternatives add up, a set counts 1); ``*``, ``+`` and ``?``
    do not unroll and count once.
    """
    # One frame per open group: [size so far, size of the last item].
    frames = [[0, 0]]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        item = 1
        if char == "\\":
            i += 1
            if pattern[i : i + 1] in ("p", "P", "N", "x") and pattern[i + 1 : i + 2] == "{":
                i = pattern.find("}", i) % (len(pattern) + 1)  # \p{Letter}: not a repeat
        elif char == "[":
            i += 1
            i += pattern[i : i + 1] == "^"
            i += pattern[i : i + 1] == "]"
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif char == "(":
            frames.append([0, 0])
            i += 1
            continue
        elif char == ")" and len(frames) > 1:
            item = frames.pop()[0]
        elif char == "{" and (counted := _COUNTED.match(pattern, i)) and any(counted.groups()):
            times = max(int(n) for n in counted.groups() if n)
            frame = frames[-1]
            frame[0] += frame[1] * (times - 1)
            frame[1] *= times
            i = counted.end()
            continue
        frames[-1][0] += item
        frames[-1][1] = item
        i += 1
    return sum(frame[0] for frame in frames)


def _check_size(pattern: str) -> None:
    size = pattern_size(pattern)
    if size > MAX_PATTERN_SIZE:
        raise ValueError(
            f"answer pattern unrolls to {size} items (counted repeats multiply): "
            f"at most {MAX_PATTERN_SIZE}"
        )


@lru_cache(maxsize=64)
def _compile(pattern: str) -> Any:
    _check_size(pattern)
    if _regex_module is None:  # pragma: no cover - depends on the environment
        raise RegexUnavailable("the 'regex' module is not installed")
    try:
        return _regex_module.compile(pattern)
    except _regex_module.error as exc:
        raise ValueError(f"invalid answer pattern {pattern!r}: {exc}") from exc


def _first_group(match: Any, groups: int) -> str | None:
    if match is None:
        return None
    value = match.group(1) if groups else match.group(0)
    return (value.strip() or None) if value is not None else None


def search_regex(text: str, pattern: str, timeout: float = REGEX_TIMEOUT_S) -> str | None:
    """The first match's first group (or whole match) of ``pattern`` in ``text``.

    Runs under the ``regex`` module's ``timeout``, so a catastrophically
    backtracking pattern stops instead of hanging.

    Raises:
        ValueError: the pattern does not compile or unrolls past :data:`MAX_PATTERN_SIZE`.
        RegexUnavailable: the ``regex`` module is not installed.
        RegexTimeout: the search ran past ``timeout`` (the sample abstains).
    """
    compiled = _compile(pattern)
    try:
        match = compiled.search(text, timeout=timeout)
    except TimeoutError:
        raise RegexTimeout(f"answer pattern ran past {timeout} s") from None
    return _first_group(match, compiled.groups)


def search_re(text: str, pattern: str) -> str | None:
    """:func:`search_regex` with the standard ``re`` and no timeout.

    Only for a process that can be killed at a deadline (the ``regex`` module missing).

    Raises:
        ValueError: the pattern does not compile.
    """
    _check_size(pattern)
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid answer pattern {pattern!r}: {exc}") from exc
    return _first_group(compiled.search(text), compiled.groups)


def extract(
    text: str,
    kind: str,
    pattern: str | None = None,
    timeout: float = REGEX_TIMEOUT_S,
    *,
    reasoning_tags: ReasoningTags = DEFAULT_REASONING_TAGS,
) -> str | None:
    """The final answer of one sample's ``text`` for ``kind``, or None to abstain.

    Only the final answer is read, never a thought (see :func:`read_thought`); a
    sample whose thought never closed abstains. ``pattern`` (required) and
    ``timeout`` (seconds) are the ``regex`` kind's.

    Raises:
        ValueError: unknown kind, or a ``regex`` kind without a valid pattern.
        RegexTimeout: the ``regex`` kind's search ran past ``timeout``.
    """
    check_kind(kind)
    if kind == "regex" and not pattern:
        raise ValueError("answer kind 'regex' needs a pattern")
    thought = read_thought(text, reasoning_tags)
    if thought.cut:
        return None
    text = thought.content
    if kind == "regex":
        assert pattern is not None
        return search_regex(text, pattern, timeout)
    if kind == "number":
        return _extract_number(text)
    if kind == "math":
        return _extract_math(text)
    if kind == "choice":
        return _extract_choice(text)
    if kind == "exact":
        return fold_ws(text) or None
    return _extract_auto(text)
