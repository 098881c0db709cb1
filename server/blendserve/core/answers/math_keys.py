"""Sympy-based canonical keys for math answers (may be slow: run them under a deadline).

:func:`sympy_key` parses a cleaned LaTeX answer with ``latex2sympy2_extended`` (the
parser behind ``math-verify``, used as a parser only) and prints a deterministic
canonical form, so that equivalent answers share a key (docs/policies.md, "Answers"):
sets are order-free, tuples ordered, intervals keep their ends, polynomial equations
are monic. Nothing here has a time limit: callers run :func:`sympy_key` where it can
be killed, on inputs :func:`is_safe_for_sympy` accepts. sympy is imported lazily.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

from blendserve.core.answers.normalize import (
    bounded_key,
    clean_math,
    fold_ws,
    is_text_answer,
    math_fallback_key,
)

__all__ = ["MAX_SYMPY_CHARS", "is_safe_for_sympy", "plain_number_key", "sympy_key", "warm_up"]

#: Longer answers never reach sympy.
MAX_SYMPY_CHARS = 300
#: Largest literal integer exponent, factorial argument or digit run sent to sympy.
_MAX_EXPONENT = 1000
#: Largest literal exponent of an answer with a variable: ``(9x+99)^{1000}`` expands
#: to a polynomial of a thousand terms of hundreds of digits (megabytes, seconds).
_MAX_SYMBOLIC_EXPONENT = 64
_MAX_FACTORIAL = 1000
_MAX_DIGITS = 120

_DIGITS_RE = re.compile(r"\d+")
#: A plain decimal number: sign, digits (thousands groups allowed), point, exponent.
_PLAIN_NUMBER_RE = re.compile(
    r"[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE](?P<exp>[+-]?\d+))?"
)
_FACTORIAL_RE = re.compile(r"(?<!\\)!")
_BASE_NUMBER_RE = re.compile(r"^\d+_\{?\d+\}?$")
_OPERATORS_RE = re.compile(r"\\(?:[dt]?frac|cdot|times|div|sqrt|left|right)(?![a-zA-Z])")
_BANNED_RE = re.compile(r"\\(?:uparrow|Uparrow|underbrace|overbrace|operatorname\{tet)|\*\*")


def _exponent_spans(text: str) -> list[str]:
    """The exponents of ``text``: braced contents after ``^`` or the next token."""
    spans: list[str] = []
    i = text.find("^")
    while i >= 0:
        j = i + 1
        while j < len(text) and text[j] == " ":
            j += 1
        if j < len(text) and text[j] == "{":
            depth, k = 0, j
            while k < len(text):
                depth += (text[k] == "{") - (text[k] == "}")
                if depth == 0:
                    break
                k += 1
            spans.append(text[j + 1 : k])
        else:
            digits = _DIGITS_RE.match(text, j)
            spans.append(digits.group() if digits else text[j : j + 1])
        i = text.find("^", i + 1)
    return spans


def _safe_exponents(answer: str) -> bool:
    """No power tower, huge literal exponent, or big power of an expression with a variable."""
    variables = re.search(r"[a-zA-Z]", _OPERATORS_RE.sub("", answer)) is not None
    largest = _MAX_SYMBOLIC_EXPONENT if variables else _MAX_EXPONENT
    for exponent in _exponent_spans(answer):
        literal = int(exponent) if exponent.strip().isdecimal() else None
        if literal is not None and literal > largest:
            return False
        symbolic = re.search(r"[a-zA-Z]", _OPERATORS_RE.sub("", exponent))
        if "^" in exponent and not symbolic:
            return False
        if literal is None and re.search(r"\d{5,}", exponent):
            return False
    return True


def is_safe_for_sympy(answer: str) -> bool:
    """Whether a cleaned answer may be given to sympy at all.

    Refuses long answers, power towers with numeric exponents (``9^{9^{9^9}}``,
    ``10^{10^{10}}``), huge literal exponents, factorials of large or compound
    arguments (``1000000000!``, ``(10!)!``), double superscripts and very long
    digit runs: these can make sympy compute for minutes or exhaust memory.
    """
    if not answer or len(answer) > MAX_SYMPY_CHARS or _BANNED_RE.search(answer):
        return False
    if any(len(run) > _MAX_DIGITS for run in _DIGITS_RE.findall(answer)):
        return False
    if not _safe_exponents(answer):
        return False
    if re.search(r"\^\s*(?:\{[^{}]*\}|\w)\s*\^", answer):
        return False
    factorials = [m.start() for m in _FACTORIAL_RE.finditer(answer)]
    for pos in factorials:
        before = answer[:pos].rstrip()
        digits = re.search(r"\d+$", before)
        if digits is not None:
            if int(digits.group()) > _MAX_FACTORIAL:
                return False
        elif before.endswith((")", "}", "!")) and (len(factorials) > 1 or "^" in answer):
            return False
    return True


def plain_number_key(cleaned: str) -> str | None:
    """The key of a cleaned answer that is a plain decimal number, without sympy; else None.

    The key is the exact rational sympy would print (``144.0`` -> ``144``,
    ``0.5`` -> ``1/2``, ``1,000`` -> ``1000``), and ``1.44e2`` is 144 (sympy
    would read the ``e`` as Euler's number). An exponent past
    :data:`_MAX_EXPONENT` keys as text.
    """
    match = _PLAIN_NUMBER_RE.fullmatch(cleaned)
    if match is None:
        return None
    exponent = match.group("exp")
    if exponent is not None and abs(int(exponent)) > _MAX_EXPONENT:
        return math_fallback_key(cleaned)
    return str(Fraction(Decimal(cleaned.replace(",", ""))))


def warm_up() -> None:
    """Imports sympy and the LaTeX parser and parses a few forms (first uses are slow)."""
    for answer in ("\\frac{1}{2}", "2\\sqrt{2}", "(1,2)", "\\{1,2\\}", "x^2+1", "x=1"):
        sympy_key(answer)


def _parse(cleaned: str) -> Any:
    from latex2sympy2_extended import NormalizationConfig, latex2sympy

    config = NormalizationConfig(
        basic_latex=True,
        units=True,
        malformed_operators=True,
        nits=True,
        boxed="none",
        equations=False,
    )
    return latex2sympy(cleaned, normalization_config=config)


def _imaginary(expr: Any) -> Any:
    import sympy

    unit = [s for s in expr.free_symbols if isinstance(s, sympy.Symbol) and s.name == "i"]
    return expr.subs({s: sympy.I for s in unit}) if unit else expr


def _exact(expr: Any) -> Any:
    """``expr`` with each float the decimal it reads as (``nsimplify`` may give a float's
    binary value instead, a fraction of hundreds of digits for ``90114.0549``)."""
    import sympy

    return expr.xreplace({f: sympy.Rational(str(f)) for f in expr.atoms(sympy.Float)})


def _canon_expr(expr: Any) -> str:
    import sympy

    expr = _exact(_imaginary(expr))
    expr = expr.doit()
    symbols = expr.free_symbols
    if not symbols:
        expr = sympy.nsimplify(sympy.simplify(expr), rational=True)
    elif expr.is_rational_function(*symbols):
        expr = sympy.cancel(expr)
    else:
        expr = sympy.simplify(expr)
    return str(sympy.sstr(expr))


def _canon_equation(lhs: Any, rhs: Any, named: bool) -> str:
    import sympy

    # A lone ``x = v`` keys as ``v``; inside a set or tuple the name matters
    # (``a=1,b=2`` is not ``a=2,b=1``).
    if isinstance(rhs, sympy.Symbol) and not isinstance(lhs, sympy.Symbol):
        lhs, rhs = rhs, lhs
    if isinstance(lhs, sympy.Symbol) and lhs not in getattr(rhs, "free_symbols", ()):
        return f"{lhs.name}={_canon(rhs)}" if named else _canon(rhs)
    difference = sympy.together(_imaginary(_exact(lhs - rhs)))
    numerator = sympy.numer(difference)
    symbols = sorted(numerator.free_symbols, key=lambda s: s.name)
    if symbols and numerator.is_polynomial(*symbols):
        return "eq:" + str(sympy.sstr(sympy.Poly(numerator, *symbols).monic().as_expr())) + "=0"
    return "eq:" + _canon_expr(difference) + "=0"


def _canon(expr: Any, top: bool = True) -> str:
    """Deterministic canonical text of one parsed answer."""
    import sympy

    if isinstance(expr, (list, tuple, sympy.Tuple)):
        return "(" + ",".join(_canon(e, False) for e in expr) + ")"
    if isinstance(expr, sympy.FiniteSet):
        return "{" + ",".join(sorted({_canon(e, False) for e in expr})) + "}"
    if isinstance(expr, sympy.MatrixBase):
        rows = [",".join(_canon(e) for e in expr.row(i)) for i in range(expr.rows)]
        return "matrix[" + ";".join(rows) + "]"
    if isinstance(expr, sympy.Interval):
        left = "(" if expr.left_open else "["
        right = ")" if expr.right_open else "]"
        return f"{left}{_canon(expr.start)},{_canon(expr.end)}{right}"
    if isinstance(expr, sympy.Union):
        return "U".join(sorted(_canon(e) for e in expr.args))
    if isinstance(expr, sympy.Equality):
        return _canon_equation(expr.lhs, expr.rhs, named=not top)
    if isinstance(expr, sympy.core.relational.Relational):
        return "rel:" + str(sympy.sstr(expr.canonical))
    if isinstance(expr, (sympy.And, sympy.Or)):
        return type(expr).__name__ + "(" + ",".join(sorted(_canon(e) for e in expr.args)) + ")"
    if isinstance(expr, sympy.Expr):
        return _canon_expr(expr)
    return str(sympy.sstr(expr))


def sympy_key(answer: str) -> str:
    """Canonical key of a math answer via sympy (slow; no time limit of its own).

    Plain words key as lower-cased text, numbers in a base (``204_5``) and
    answers sympy cannot parse as :func:`~blendserve.core.answers.normalize.math_fallback_key`.
    Callers should check :func:`is_safe_for_sympy` first and run this under a deadline.
    """
    cleaned = clean_math(answer)
    words = is_text_answer(cleaned)
    if words is not None:
        return words
    if not is_safe_for_sympy(cleaned) or _BASE_NUMBER_RE.match(cleaned.replace(" ", "")):
        return math_fallback_key(cleaned)
    number = plain_number_key(cleaned)
    if number is not None:
        return number
    try:
        return bounded_key(fold_ws(_canon(_parse(cleaned))))
    except Exception:  # any parser or sympy failure: the answer keys as text
        return math_fallback_key(cleaned)
