"""Plain numbers key without sympy, as sympy would key them; exponents read as exponents."""

from __future__ import annotations

from decimal import Decimal

import pytest
from blendserve.answers import AnswerKeys
from blendserve.core.answers import clean_math, extract, number_key, plain_number_key
from blendserve.core.answers.math_keys import _canon, _parse
from blendserve.core.answers.normalize import fold_ws
from hypothesis import given, settings
from hypothesis import strategies as st

_DECIMALS = st.decimals(allow_nan=False, allow_infinity=False, places=4).filter(
    lambda d: abs(d) < Decimal(10) ** 30
)


def _sympy_path(text: str) -> str:
    """The key a worker gave every number before the fast path (the parser's own)."""
    return fold_ws(_canon(_parse(clean_math(text))))


@settings(max_examples=150, deadline=None)
@given(_DECIMALS, st.sampled_from(["{}", "{:f}", "+{}"]))
def test_a_plain_number_keys_as_sympy_keys_it(value: Decimal, form: str) -> None:
    text = form.format(value)
    if text.startswith("+-"):
        text = text[1:]
    assert plain_number_key(clean_math(text)) == _sympy_path(text)


@pytest.mark.parametrize(
    "text",
    ["144", "144.0", ".5", "5.", "-0", "007", "1,000", "12,345.25", "-3.14159", "90114.0549"],
)
def test_common_forms_key_as_sympy_keys_them(text: str) -> None:
    assert plain_number_key(clean_math(text)) == _sympy_path(text)


@pytest.mark.parametrize("text", ["x", "1,00", "e5", ".", "-", "1/2", "2^3", "1.5.2", "5%"])
def test_anything_else_is_not_a_plain_number(text: str) -> None:
    assert plain_number_key(text) is None


@pytest.mark.parametrize(
    ("forms", "key"),
    [(["1.44e2", "144", "1.44E+2", "144.0"], "144"), (["1e-3", "0.001", "10^{-3}"], "1/1000")],
)
def test_an_exponent_is_a_power_of_ten_in_math_keys(forms: list[str], key: str) -> None:
    keys = AnswerKeys()
    try:
        assert {keys.canonical_key(form, kind) for form in forms for kind in ("math", "auto")} == {
            key
        }
    finally:
        keys.shutdown()


def test_a_huge_exponent_keys_as_text() -> None:
    assert plain_number_key("1e99999") == "1e99999"


def test_the_number_kind_reads_an_exponent() -> None:
    assert number_key("1.44e2") == number_key("144") == "144"
    assert number_key("6.02e23") == "602" + "0" * 21
    assert extract("the mass is 6.02e23 grams", "number") == "6.02e23"
    assert extract("so 1.44e2 apples", "auto") == "1.44e2"
    assert extract("3e4x boxes, then 5", "number") == "5"  # not an exponent: a word follows


def test_plain_numbers_never_reach_a_worker() -> None:
    keys = AnswerKeys()
    try:
        assert [keys.canonical_key(str(n / 8), "auto") for n in range(1, 400)][-1] == "399/8"
        assert keys.cache_info().misses == 0
        assert keys.pool is None
    finally:
        keys.shutdown()
