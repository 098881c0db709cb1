"""String normalisation for answers: boxes, numbers, LaTeX clean-up and cheap keys.

Everything here is linear in the input (no backtracking-prone regexes, no nested
scans), so it is safe on hostile model output inline. A trailing ``%`` (or ``\\%``),
degrees (``^\\circ``) and dollar signs are dropped in every kind: ``50%`` keys as
``50`` (never ``0.5``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

__all__ = [
    "MAX_CLEAN_CHARS",
    "BoxScan",
    "choice_key",
    "clean_math",
    "exact_key",
    "fold_ws",
    "is_text_answer",
    "math_fallback_key",
    "number_key",
    "parse_number",
    "scan_boxes",
    "unwrap_box",
]

#: Longer answers are only whitespace-folded: no model answer is this long.
MAX_CLEAN_CHARS = 2000

#: A number token: optional sign and currency, thousands groups, decimals, an
#: exponent (``6.02e23``) or ``a/b``.
NUMBER_RE = re.compile(
    r"(?<![\w.])(?P<neg>[-\u2212]\s?)?(?:\\?\$\s?)?(?P<neg2>[-\u2212])?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:(?P<exp>[eE][+-]?\d+)(?!\w)|\s?/\s?(?P<den>\d+))?(?![\d])"
)

_BOX_TOKEN_RE = re.compile(r"\\(?:boxed|fbox)\s*\{|\{|\}")
_WHOLE_BOX_RE = re.compile(r"\s*\\(?:boxed|fbox)\s*\{")
_TEXT_WRAP_RE = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{")
_THOUSANDS_RE = re.compile(r"(?<=\d),\s?\\!\s?(?=\d)")
_NEG_SPACE_RE = re.compile(r"(?<!\\)\\!|(?<=\d)\\,(?=\d)")
_SPACING_RE = re.compile(r"(?<!\\)\\[,;: ]|\\q?quad(?![a-zA-Z])")
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![a-zA-Z])")
_DEGREE_RE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|°")
_FRAC_SHORT_RE = re.compile(r"\\frac\s*(\d)\s*(\d)")
_FRAC_HALF_RE = re.compile(r"\\frac\s*(\d)\s*(?=\{)")
_SQRT_SHORT_RE = re.compile(r"\\sqrt\s*(\d+|[a-zA-Z])")
_UNIT_TAIL_RE = re.compile(
    r"\\(?:text|mbox|mathrm)\s*\{\s*[a-zA-Z][a-zA-Z .]*\}(?:\^\s*\{?\d\}?)?\s*$"
)
_LONE_ASSIGN_RE = re.compile(r"^\s*\\?[a-zA-Z]{1,2}(?:_\{?\w\}?)?\s*=(?![=<>])")
_SUBSCRIPT_BRACES_RE = re.compile(r"_\{(\w+)\}")
_A_SLASH_B_RE = re.compile(r"^(-?\d+)/(\d+)$")
_WORDS_RE = re.compile(r"^[A-Za-z][A-Za-z '\-]*$")
_TWO_LETTERS_RE = re.compile(r"[A-Za-z]{2}")


def fold_ws(text: str) -> str:
    """Trims and folds every run of whitespace into one space."""
    return " ".join(text.split())


def exact_key(text: str) -> str:
    """Key of the ``exact`` kind: the trimmed, whitespace-folded text."""
    return fold_ws(text)


@dataclass(frozen=True)
class BoxScan:
    """The last top-level ``\\boxed{...}``/``\\fbox{...}`` of a text: its ``content`` (None
    when there is none or it is ``unclosed``, a truncated sample) and ``start``, the index
    of its command (-1: no box)."""

    content: str | None
    start: int = -1
    unclosed: bool = False


_NO_BOX = BoxScan(None)


def scan_boxes(text: str) -> BoxScan:
    """Finds the last top-level box in one linear pass.

    Boxes nested in another box do not count (the outer one does), so
    ``\\boxed{\\boxed{5}}`` gives ``\\boxed{5}``; stray ``}`` are ignored.
    """
    if "\\boxed" not in text and "\\fbox" not in text:
        return _NO_BOX
    stack: list[bool] = []  # one entry per open brace: does it open a box?
    box_depth = 0
    last_start = -1
    content_start = -1
    content: str | None = None
    for match in _BOX_TOKEN_RE.finditer(text):
        token = match.group()
        if token == "}":
            if not stack:
                continue
            if stack.pop():
                box_depth -= 1
                if box_depth == 0:
                    content = text[content_start : match.start()]
            continue
        is_box = token != "{"
        if is_box and box_depth == 0:
            last_start, content_start, content = match.start(), match.end(), None
        box_depth += is_box
        stack.append(is_box)
    if last_start < 0:
        return BoxScan(None)
    if content is None:
        return BoxScan(None, last_start, unclosed=True)
    return BoxScan(content, last_start)


def unwrap_box(text: str) -> str:
    """``\\boxed{x}`` -> ``x`` when the whole text is one box (repeatedly)."""
    for _ in range(8):
        head = _WHOLE_BOX_RE.match(text)
        if head is None:
            return text
        scan = scan_boxes(text)
        if scan.content is None or scan.start != head.start() or text.rstrip()[-1:] != "}":
            return text
        end = text.rstrip()
        if len(scan.content) != len(end) - head.end() - 1:
            return text
        text = scan.content
    return text


def _match_brace(text: str, open_index: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``open_index``, or -1."""
    depth = 0
    for i in range(open_index, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _unwrap_text_commands(text: str) -> str:
    """``\\text{abc}`` -> ``abc`` (also ``\\mathrm``, ``\\mbox``...), linear overall."""
    out: list[str] = []
    pos = 0
    while True:
        match = _TEXT_WRAP_RE.search(text, pos)
        if match is None:
            out.append(text[pos:])
            return "".join(out)
        close = _match_brace(text, match.end() - 1)
        if close < 0:
            out.append(text[pos:])
            return "".join(out)
        out.append(text[pos : match.start()])
        out.append(text[match.end() : close])
        pos = close + 1


def _strip_delimiters(text: str) -> str:
    text = text.strip()
    for _ in range(4):
        before = text
        if len(text) >= 2 and text[0] == "$" and text[-1] == "$" and text != "$$":
            text = text.strip("$").strip()
        elif text.startswith(("\\(", "\\[")) and text.endswith(("\\)", "\\]")):
            text = text[2:-2].strip()
        text = text.rstrip(".").rstrip()
        if text == before:
            break
    return text


def clean_math(answer: str) -> str:
    """Light clean-up of a math answer, in the spirit of Hendrycks MATH ``strip_string``.

    Removes delimiters, an enclosing box, ``\\left``/``\\right``, spacing commands,
    ``\\$``, ``%``, degrees and trailing unit words; rewrites ``\\dfrac``/``\\tfrac``,
    ``\\frac12`` and ``\\sqrt2``; adds the leading zero of ``.5``; drops a short
    ``x =`` prefix. Spaces inside are kept (``\\cot x`` must stay parseable).
    """
    if len(answer) > MAX_CLEAN_CHARS:
        return fold_ws(answer)
    text = unwrap_box(_strip_delimiters(answer))
    text = text.replace("\n", " ").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _SPACING_RE.sub(" ", _NEG_SPACE_RE.sub("", _THOUSANDS_RE.sub(",", text)))
    text = _LEFT_RIGHT_RE.sub("", text)
    text = _DEGREE_RE.sub("", text)
    text = text.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    text = text.replace("{,}", ",")
    for _ in range(2):
        stripped = _UNIT_TAIL_RE.sub("", text).strip()
        if stripped and stripped != text and not _TWO_LETTERS_RE.fullmatch(stripped):
            text = stripped
    text = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", text)
    text = _FRAC_HALF_RE.sub(r"\\frac{\1}", text)
    text = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", text)
    text = fold_ws(text)
    if text.count("=") == 1 and "," not in text:
        prefix = _LONE_ASSIGN_RE.match(text)
        if prefix is not None and text[prefix.end() :].strip():
            text = text[prefix.end() :].strip()
    text = text.replace(" .", " 0.").replace("{.", "{0.").replace("(.", "(0.")
    if text.startswith("."):
        text = "0" + text
    elif text.startswith("-."):
        text = "-0" + text[1:]
    return _strip_delimiters(text)


def is_text_answer(cleaned: str) -> str | None:
    """The lower-cased words when a cleaned answer is plain text (``\\text{East}``), else None.

    Single letters (variables) and anything with digits or operators are not text.
    """
    if len(cleaned) > MAX_CLEAN_CHARS:
        return None
    plain = fold_ws(_unwrap_text_commands(cleaned))
    if _WORDS_RE.match(plain) and _TWO_LETTERS_RE.search(plain):
        return plain.lower()
    return None


def choice_key(answer: str) -> str:
    """Key of the ``choice`` kind: the upper-case letter of ``C``, ``(c)``, ``\\text{C}``...

    Anything that does not start with a lone letter A-J keys as upper-cased,
    whitespace-folded text.
    """
    if len(answer) > MAX_CLEAN_CHARS:
        return fold_ws(answer).upper()
    text = _unwrap_text_commands(unwrap_box(_strip_delimiters(answer))).strip(" \t\n()[]*_.:")
    if text and text[0] in "ABCDEFGHIJabcdefghij" and (len(text) == 1 or not text[1].isalnum()):
        return text[0].upper()
    return fold_ws(answer).upper()


#: Longer keys are replaced by their digest: a key is held per vote and sent in replies.
MAX_KEY_CHARS = 256


def bounded_key(key: str) -> str:
    """``key``, or past :data:`MAX_KEY_CHARS` its SHA-256 (equal keys stay equal, and short)."""
    if len(key) <= MAX_KEY_CHARS:
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def math_fallback_key(answer: str) -> str:
    """The string key of a math answer that sympy does not (or may not) see.

    Hendrycks-style: :func:`clean_math`, no spaces, braces of simple subscripts
    dropped, ``a/b`` -> ``\\frac{a}{b}`` and ``0.5`` -> ``\\frac{1}{2}``.
    """
    text = clean_math(answer).replace(" ", "")
    text = _SUBSCRIPT_BRACES_RE.sub(r"_\1", text)
    slash = _A_SLASH_B_RE.match(text)
    if slash is not None:
        text = f"\\frac{{{slash.group(1)}}}{{{slash.group(2)}}}"
    if text == "0.5":
        text = "\\frac{1}{2}"
    return text


def _decimal_text(value: Decimal) -> str:
    """Exact, context-free canonical form: no trailing zeros, no exponent when short."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    digit_list = list(digits)
    while len(digit_list) > 1 and digit_list[-1] == 0:
        digit_list.pop()
        exponent += 1
    if digit_list == [0]:
        return "0"
    body = "".join(map(str, digit_list))
    if exponent >= 0:
        if exponent > 64:  # 1e999999999 must not become a billion characters
            text = f"{body[0]}.{body[1:]}E+{len(body) - 1 + exponent}".replace(".E", "E")
        else:
            text = body + "0" * exponent
    elif -exponent >= len(body):
        zeros = -exponent - len(body)
        text = (f"0.{'0' * zeros}{body}") if zeros <= 64 else f"{body}E{exponent}"
    else:
        text = f"{body[:exponent]}.{body[exponent:]}"
    return ("-" if sign else "") + text


def parse_number(token: str) -> str | None:
    """Canonical text of one number token (``-$1,000.50`` -> ``-1000.5``), or None."""
    match = NUMBER_RE.search(token)
    if match is None:
        return None
    negative = bool(match.group("neg") or match.group("neg2"))
    try:
        value = Decimal(match.group("num").replace(",", "") + (match.group("exp") or ""))
    except InvalidOperation:
        return None
    den = match.group("den")
    if den is not None:
        if int(den) == 0 or len(den) > 30:
            return None
        fraction = Fraction(value) / int(den)
        as_decimal = Decimal(fraction.numerator) / Decimal(fraction.denominator)
        if Fraction(as_decimal) == fraction:
            value = as_decimal
        else:
            text = f"{fraction.numerator}/{fraction.denominator}"
            return f"-{text}" if negative and fraction else text
    text = _decimal_text(value)
    return f"-{text}" if negative and text != "0" else text


def number_key(answer: str) -> str | None:
    """Key of the ``number`` kind: the first number of the answer via Decimal, or None.

    ``1,000``, ``$1000.00``, ``1e3`` and ``1000`` share the key ``1000``; ``50%``
    keys as ``50``; ``3/4`` and ``0.75`` share ``0.75``.
    """
    plain = answer.strip()
    if len(plain) <= 30 and plain.isascii() and plain.isdigit():  # the common case, fast
        return plain.lstrip("0") or "0"
    return parse_number(answer.replace("{,}", ",").replace("\\!", ""))
