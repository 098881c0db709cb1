"""The stream's learned prior and the waves its dynamic programme sizes."""

import pytest
from blendserve.core.prior import SHARES
from blendserve.core.programme import VotePrior, start_log_price
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.priors import fitted_prior

_PRICE = -5.0


def test_em_recovers_a_stream_of_easy_and_close_questions() -> None:
    prior = fitted_prior([0.97] * 300 + [0.62] * 300, votes=16)
    assert prior.weights[SHARES >= 0.9].sum() == pytest.approx(0.5, abs=0.1)
    assert prior.weights[(SHARES > 0.52) & (SHARES < 0.75)].sum() == pytest.approx(0.5, abs=0.12)


def test_a_unanimous_question_stops_before_a_tied_one() -> None:
    prior = VotePrior()
    assert prior.wave(6, 0, 6, _PRICE, 2) == 0 and prior.settled(6, 0, _PRICE)
    assert prior.wave(3, 3, 6, _PRICE, 2) > 0 and not prior.settled(3, 3, _PRICE)
    assert prior.wave(3, 3, 6, _PRICE, 0) == 0  # no rounds left


def test_what_the_stream_looked_like_decides_when_a_question_is_sure() -> None:
    peaked = fitted_prior([0.99] * 400 + [0.7] * 20, votes=8)
    close = fitted_prior([0.7] * 400 + [0.99] * 20, votes=8)
    # Three votes for one answer: sure on a peaked stream, not on a close one.
    assert peaked.wave(3, 0, 3, _PRICE, 3) == 0 < close.wave(3, 0, 3, _PRICE, 3)
    # Where more votes would barely help, they are not bought at that price.
    hopeless = fitted_prior([0.6] * 400 + [0.99] * 20, votes=8)
    assert hopeless.wave(3, 0, 3, _PRICE, 3) == 0


def test_a_wave_is_sent_as_samples_for_the_votes_it_needs() -> None:
    prior = VotePrior()
    votes = prior.wave(2, 2, 4, _PRICE, 2)
    # Half of the question's samples went to neither of its top two answers.
    assert prior.wave(2, 2, 8, _PRICE, 2) >= 2 * votes - 1


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 30), st.integers(0, 30), st.integers(1, 6))
def test_a_lower_price_never_buys_fewer_votes_in_total(n1: int, n2: int, rounds: int) -> None:
    prior = VotePrior()
    n1, n2 = max(n1, n2), min(n1, n2)
    cheap = prior.wave(n1, n2, n1 + n2, -9.0, rounds)
    dear = prior.wave(n1, n2, n1 + n2, -2.0, rounds)
    assert dear == 0 or cheap > 0
    assert prior.expected_votes(-9.0, rounds) >= prior.expected_votes(-2.0, rounds)


@pytest.mark.parametrize("budget", [3.0, 8.0, 20.0])
def test_the_start_price_spends_about_the_budget(budget: float) -> None:
    prior = VotePrior()
    log_price = start_log_price(budget, 4)
    assert prior.expected_votes(log_price, 4) <= budget < prior.expected_votes(log_price - 0.1, 4)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        VotePrior(max_votes=0)
