"""A prior's waves read without building (for the pools' event loop), and the programmes kept."""

import copy

import pytest
from blendserve.core import programme
from blendserve.core.programme import VotePrior, start_log_price, start_log_price_known

from tests.support.priors import fitted_prior, no_built_programmes

_PRICE = -5.0


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    no_built_programmes(monkeypatch)


_STATES = [(n1, n2, s) for n1 in range(0, 20, 3) for n2 in range(0, n1 + 1, 2) for s in (0, 30)]


def test_ready_builds_nothing_and_then_decides_as_the_prior() -> None:
    prior = fitted_prior([0.97] * 50 + [0.62] * 50)
    assert prior.ready(_PRICE, 4) is None and not prior.programme_built
    assert programme._PROGRAMMES.nbytes == 0  # asking built nothing
    prior.need(_PRICE, 4).build()
    ready = prior.ready(_PRICE, 4)
    assert ready is not None and prior.programme_built
    for n1, n2, samples in _STATES:
        for rounds in (1, 2, 4):
            expected = prior.wave(n1, n2, samples and n1 + n2 + samples, _PRICE, rounds)
            assert ready.wave(n1, n2, samples and n1 + n2 + samples, _PRICE, rounds) == expected
        assert ready.settled(n1, n2, _PRICE) == prior.settled(n1, n2, _PRICE)
    with pytest.raises(ValueError, match="built for"):
        ready.wave(3, 0, 3, _PRICE - 1.0, 1)  # another price: tables it does not have


def test_a_refitted_prior_decides_with_its_previous_programme_until_its_own_is_built() -> None:
    prior = fitted_prior([0.97] * 100)
    before = copy.deepcopy(prior)
    prior.need(_PRICE, 2).build()
    for _ in range(200):  # now a stream of close questions
        prior.observe(9, 7, 16)
    prior.fit()
    assert prior.ready(_PRICE, 2) is None
    fallback = prior.fallback(_PRICE, 2)
    assert fallback is not None
    states = [(n1, n2, n1 + n2) for n1, n2, _ in _STATES if n1 + n2]
    assert [fallback.wave(*s, _PRICE, 2) for s in states] == [
        before.wave(*s, _PRICE, 2) for s in states
    ]
    # Once its own programme is built, the same view decides as the refitted prior.
    prior.need(_PRICE, 2).build()
    assert [fallback.wave(*s, _PRICE, 2) for s in states] == [
        prior.wave(*s, _PRICE, 2) for s in states
    ]
    assert any(prior.wave(*s, _PRICE, 2) != before.wave(*s, _PRICE, 2) for s in states)


def test_a_fitted_prior_falls_back_on_a_new_streams_programme() -> None:
    prior = fitted_prior([0.62] * 100)
    assert prior.fallback(_PRICE, 3) is None
    prior.fallback_need(_PRICE, 3).build()
    fallback = prior.fallback(_PRICE, 3)
    assert fallback is not None and not prior.programme_built
    fresh = VotePrior()
    assert fallback.wave(4, 1, 5, _PRICE, 3) == fresh.wave(4, 1, 5, _PRICE, 3)


def test_programmes_are_kept_within_a_byte_budget_and_a_new_streams_is_never_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fresh = VotePrior()
    fresh.need(_PRICE, 1).build()
    one = fresh._programme().nbytes
    kept = programme._Programmes(budget=int(3.5 * one))
    monkeypatch.setattr(programme, "_PROGRAMMES", kept)
    priors = [fresh] + [fitted_prior([x] * 60) for x in (0.6, 0.8, 0.95)]
    for prior in priors:
        prior.need(_PRICE, 1).build()
    assert kept.nbytes <= kept.budget
    assert [p.programme_built for p in priors] == [True, False, True, True]
    priors[2].wave(2, 0, 2, _PRICE, 1)  # used: the least recently used goes next
    priors[1].wave(2, 0, 2, _PRICE, 1)
    assert [p.programme_built for p in priors] == [True, True, True, False]


def test_a_stop_short_of_the_horizon_at_a_low_price_is_the_horizons() -> None:
    prior = VotePrior()
    low = -15.9  # a budget's price well past what 64 votes can spend
    # A near-tie the programme stopped for want of room: 64 more votes were worth buying.
    assert prior.settled(32, 31, low) and prior.past_horizon(32, 31, low, limit=10_000)
    assert not prior.past_horizon(32, 31, low, limit=1)  # the cap leaves no room either
    # A unanimous question at an ordinary budget's price settled on its price.
    assert prior.settled(6, 0, _PRICE) and not prior.past_horizon(6, 0, _PRICE, limit=48)
    assert not prior.past_horizon(3, 3, _PRICE, limit=100)  # room for every wave


def test_start_prices_are_known_once_computed() -> None:
    assert not start_log_price_known(8.0, 4)
    price = start_log_price(8.0, 4)
    assert start_log_price_known(8.0, 4) and not start_log_price_known(9.0, 4)
    assert VotePrior().expected_votes(price, 4) <= 8.0
