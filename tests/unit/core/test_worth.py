import numpy as np
import pytest
from blendserve.core.prior import SHARES, fit_shares
from blendserve.core.worth import LOOK_AHEAD, VoteWorth
from scipy import stats


def _error(weights: np.ndarray, a: int, b: int) -> float:
    """The posterior chance that the answer with ``a`` votes is not the mode (or the
    other one, whichever is smaller): from scratch, normalised."""
    first = weights * SHARES**a * (1 - SHARES) ** b
    second = weights * SHARES**b * (1 - SHARES) ** a
    total = first.sum() + second.sum()
    return float(min(first.sum(), second.sum()) / total)


def _value(weights: np.ndarray, a: int, b: int) -> float:
    """The best per-vote fall in the error over 1..LOOK_AHEAD votes, by the predictive."""
    first = weights * SHARES**a * (1 - SHARES) ** b
    second = weights * SHARES**b * (1 - SHARES) ** a
    total = first.sum() + second.sum()
    now = _error(weights, a, b)
    best = 0.0
    for w in range(1, LOOK_AHEAD + 1):
        expected = 0.0
        for j in range(w + 1):
            chance = (
                first @ stats.binom.pmf(j, w, SHARES) + second @ stats.binom.pmf(j, w, 1 - SHARES)
            ) / total
            expected += chance * _error(weights, a + j, b + w - j)
        best = max(best, (now - expected) / w)
    return best


def test_the_value_is_the_look_ahead_of_the_posterior_error() -> None:
    value = VoteWorth()
    weights = np.asarray(value.weights)
    # The first six are tabled at each fit, the last two computed one by one.
    for a, b in [(1, 0), (2, 1), (3, 1), (4, 4), (7, 2), (12, 9), (130, 126), (140, 3)]:
        assert value.worth(a, b) == pytest.approx(_value(weights, a, b), rel=1e-9, abs=1e-15)


def test_a_close_question_is_worth_more_than_a_clear_one() -> None:
    value = VoteWorth()
    assert value.worth(4, 4) > value.worth(5, 3) > value.worth(7, 1) > value.worth(8, 0)
    assert value.worth(1, 1) > value.worth(2, 0)
    assert value.worth(40, 0) < 1e-9


def test_a_flat_batch_values_a_question_that_looks_sure_more_than_a_peaked_batch_does() -> None:
    flat, peaked = VoteWorth(), VoteWorth()
    # Flat: top-two votes split 5 to 4 and 6 to 4; peaked: mostly unanimous.
    assert flat.fit(np.asarray([[5, 4], [6, 4], [5, 5], [7, 3]] * 50, dtype=np.float64))
    assert peaked.fit(np.asarray([[10, 0]] * 190 + [[6, 4]] * 10, dtype=np.float64))
    # Where most questions are close, three agreeing votes are often luck (the question
    # is not starved), and a tie is not worth much more: a few votes rarely break it.
    for looks_sure, more in [((3, 0), 10.0), ((3, 1), 1.2)]:
        in_flat = flat.worth(*looks_sure) / flat.worth(2, 2)
        in_peaked = peaked.worth(*looks_sure) / peaked.worth(2, 2)
        assert in_flat > more * in_peaked


def test_a_refit_is_due_every_so_many_votes_and_reports_a_change() -> None:
    value = VoteWorth(refit_every=3)
    assert [value.due() for _ in range(3)] == [False, False, True]
    assert not value.fit(np.zeros((4, 2)))  # no question with votes: nothing to fit
    before = value.worth(3, 1)
    assert value.fit(np.asarray([[9, 0]] * 100, dtype=np.float64))
    assert value.worth(3, 1) != before
    assert not value.fit(np.asarray([[9, 0]] * 100, dtype=np.float64))  # the same prior
    assert not value.due()  # the count restarted at the fit


def test_fit_shares_holds_questions_with_many_votes() -> None:
    weights = fit_shares(np.asarray([[2000, 1900], [3000, 0], [5, 5]], dtype=np.float64))
    assert np.all(np.isfinite(weights)) and weights.sum() == pytest.approx(1.0)
    assert weights[-1] > 0.3  # the unanimous question's share is near 1


def test_bad_refit_every_is_refused() -> None:
    with pytest.raises(ValueError):
        VoteWorth(refit_every=0)
