"""Answers that run out of time abstain and are reported; key caches are bounded by bytes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from blendserve.answers import AnswerKeys, AnswerKind, KeyOwner
from blendserve.answers._keys import REGEX_STRIKES, STRUCK_REGEX_TIMEOUT_S
from blendserve.core.answers import (
    MAX_KEY_CHARS,
    REGEX_TIMEOUT_S,
    RegexTimeout,
    extract,
    is_safe_for_sympy,
    search_regex,
)
from blendserve.testing.stats import RecordingStats

from tests.support.running import run_coroutine

#: The probe's backtracking pattern and a text on which it runs past any deadline.
BACKTRACKING = r"(?:[a-z ]|[a-z ][a-z ])+\.$"
LONG_RUN = "the quick brown fox " * 100 + ".x"


@pytest.fixture
def keys() -> Iterator[AnswerKeys]:
    state = AnswerKeys()
    yield state
    state.shutdown()


def test_a_backtracking_search_stops_at_its_time_limit() -> None:
    with pytest.raises(RegexTimeout):
        search_regex(LONG_RUN, BACKTRACKING, timeout=0.05)
    with pytest.raises(RegexTimeout):
        extract(LONG_RUN, "regex", BACKTRACKING)
    assert search_regex("the end.", BACKTRACKING) == "the end."


def test_a_timed_out_sample_abstains_and_is_reported(keys: AnswerKeys) -> None:
    stats = RecordingStats()
    keys.report_to(stats)
    assert keys.extract(LONG_RUN, "regex", BACKTRACKING) is None
    assert keys.extract("so the end.", "regex", BACKTRACKING) == "so the end."
    assert keys.cache_info().regex_timeouts == 1
    assert stats.of("answer_timeout") == [("regex",)]


def test_a_pattern_that_keeps_timing_out_gets_shorter_limits_in_its_own_job(
    keys: AnswerKeys,
) -> None:
    struck, other = KeyOwner(), KeyOwner()
    for _ in range(REGEX_STRIKES):
        assert struck.regex_timeout() == REGEX_TIMEOUT_S
        assert keys.extract(LONG_RUN, "regex", BACKTRACKING, struck) is None
    assert struck.regex_timeout() == STRUCK_REGEX_TIMEOUT_S
    assert other.regex_timeout() == REGEX_TIMEOUT_S
    assert keys.extract("so the end.", "regex", BACKTRACKING, struck) == "so the end."
    assert keys.cache_info().regex_timeouts == REGEX_STRIKES


@pytest.mark.timeout(60)
def test_a_math_answer_past_its_deadline_is_reported(keys: AnswerKeys) -> None:
    stats = RecordingStats()
    keys.report_to(stats)
    keys.configure(deadline_s=0.2)
    keys.warm_up()
    assert keys.canonical_key("(x+y+z+1)^{60}", "math") == "(x+y+z+1)^{60}"  # as text
    assert keys.cache_info().timeouts == 1
    assert stats.of("answer_timeout") == [("sympy",)]


def test_key_caches_hold_at_most_their_bytes(keys: AnswerKeys) -> None:
    keys.configure(cache_bytes=1 << 20)
    # Each raw answer is 100 kB of padding around one short fraction: only the
    # first is parsed, every other is a raw-answer entry of its own.
    padded = [f"\\frac{{1}}{{7}}{' ' * (100_000 + i)}" for i in range(60)]
    assert {keys.canonical_key(answer, "auto") for answer in padded} == {"1/7"}
    assert 0 < keys.aliases.nbytes <= 1 << 20 and len(keys.aliases) < 60
    assert keys.cache_info().misses == 1


@pytest.mark.parametrize("kind", ["math", "auto"])
def test_an_answer_that_would_expand_to_megabytes_keys_small_without_sympy(
    keys: AnswerKeys, kind: AnswerKind
) -> None:
    assert not is_safe_for_sympy(r"(9x+99)^{1000}")
    assert is_safe_for_sympy(r"(x+1)^{2}") and is_safe_for_sympy(r"10^{400}")
    key = keys.canonical_key(r"(9x+99)^{1000}", kind)
    assert len(key) <= MAX_KEY_CHARS and keys.misses == 0  # no worker was asked
    assert keys.canonical_key(r"(x+1)^{2}", kind) == "x**2 + 2*x + 1"


@pytest.mark.parametrize("kind", ["exact", "number", "math", "choice"])
def test_every_key_is_bounded_and_equal_answers_keep_equal_keys(
    keys: AnswerKeys, kind: AnswerKind
) -> None:
    long_a, long_b = "word " * 2000, "word " * 1999 + "other"
    key_a = keys.canonical_key(long_a, kind)
    assert len(key_a) <= MAX_KEY_CHARS
    assert key_a == keys.canonical_key(long_a, kind) != keys.canonical_key(long_b, kind)


def test_an_answer_that_normalises_to_nothing_does_not_vote(keys: AnswerKeys) -> None:
    keyer = keys.keyer("math")
    assert run_coroutine(keyer(r"The answer is $\boxed{$$$}$.")) == (None, None)
    answer, key = run_coroutine(keyer(r"The answer is $\boxed{7}$."))
    assert (answer, key) == ("7", "7")
