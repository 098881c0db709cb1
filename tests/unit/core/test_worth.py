import numpy as np
import pytest
from blendserve.core import worth
from blendserve.core.prior import SHARES, fit_shares
from blendserve.core.worth import LOOK_AHEAD, VoteWorth
from scipy import special, stats


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
    # The first eight are tabled at each fit, the rest (past the table) computed one by one.
    states = [(1, 0), (2, 1), (3, 1), (4, 4), (7, 2), (12, 9), (130, 126), (140, 3)]
    for a, b in [*states, (184, 180), (200, 191), (450, 430), (300, 2), (5, 250)]:
        assert value.worth(a, b) == pytest.approx(_value(weights, a, b), rel=1e-9, abs=1e-15)


def test_expected_errors_past_the_table_are_computed_as_within_it() -> None:
    """Rows that run past the table are computed apart; where both apply they agree."""
    value = VoteWorth()
    value.fit(np.asarray([[5, 4], [6, 2], [9, 0], [3, 3]] * 20, dtype=np.float64))
    for n1, n2, votes in [(0, 0, 9), (3, 2, 64), (40, 38, 128), (100, 3, 64), (120, 110, 64)]:
        tabled = worth._expected_errors(value.weights, n1, n2, votes)
        apart = worth._expected_errors_far(value.weights, n1, n2, votes)
        np.testing.assert_allclose(apart, tabled, rtol=1e-9, atol=1e-300)


def _expected_errors_in_log_space(weights: np.ndarray, n1: int, n2: int, votes: int) -> np.ndarray:
    """The expected errors after 0 to ``votes - 1`` more top-two votes, every sum in log space."""
    log_w, log_x, log_y = np.log(weights), np.log(SHARES), np.log1p(-SHARES)
    a = (n1 + np.arange(votes))[:, None, None]
    b = (n2 + np.arange(votes))[None, :, None]
    first = special.logsumexp(log_w + a * log_x + b * log_y, axis=2)
    second = special.logsumexp(log_w + b * log_x + a * log_y, axis=2)
    log_error = np.minimum(first, second)
    errors = []
    for j in range(votes):
        i = np.arange(j + 1)
        log_comb = special.gammaln(j + 1) - special.gammaln(i + 1) - special.gammaln(j - i + 1)
        errors.append(special.logsumexp(log_comb + log_error[i, j - i]))
    return np.exp(np.asarray(errors) - np.logaddexp(first[0, 0], second[0, 0]))


@pytest.mark.parametrize(
    "n1, n2, votes", [(200, 190, 9), (3000, 2, 64), (241, 63, 256), (27, 254, 256), (9, 1500, 16)]
)
def test_expected_errors_past_the_table_are_the_sums_in_log_space(
    n1: int, n2: int, votes: int
) -> None:
    value = VoteWorth()
    value.fit(np.asarray([[5, 4], [6, 2], [9, 0], [3, 3], [12, 0]] * 20, dtype=np.float64))
    far = worth._expected_errors_far(value.weights, n1, n2, votes)
    reference = _expected_errors_in_log_space(np.asarray(value.weights), n1, n2, votes)
    np.testing.assert_allclose(far, reference, rtol=1e-9, atol=0)


def test_chances_too_small_for_a_product_are_summed_in_log_space() -> None:
    """A lopsided state's chances a few votes on underflow as products of their terms:
    they stay finite, as sums taken wholly in log space give them."""
    log_w = np.log(np.asarray(VoteWorth().weights))
    chances = worth._log_chances(log_w, 100_000, 0, 64)
    a = (100_000 + np.arange(64))[:, None, None]
    b = np.arange(64)[None, :, None]
    reference = special.logsumexp(log_w + a * np.log(SHARES) + b * np.log1p(-SHARES), axis=2)
    assert np.all(np.isfinite(chances))
    np.testing.assert_allclose(chances, reference, rtol=1e-12)


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


def _em(votes: np.ndarray) -> np.ndarray:
    """The EM fit from scratch, one row a question."""
    likelihood = np.stack(
        [SHARES ** votes[:, :1] * (1 - SHARES) ** votes[:, 1:],
         SHARES ** votes[:, 1:] * (1 - SHARES) ** votes[:, :1]]
    ).sum(axis=0)  # fmt: skip
    weights = np.full(len(SHARES), 1 / len(SHARES))
    for _ in range(200):
        joint = likelihood * weights
        joint /= joint.sum(axis=1, keepdims=True)
        weights = joint.mean(axis=0) + 1e-4
        weights /= weights.sum()
    return weights


def test_fit_shares_counts_each_question_once_however_they_repeat() -> None:
    rng = np.random.default_rng(3)
    n1 = rng.integers(0, 9, size=300)
    votes = np.column_stack((n1, rng.integers(0, 9, size=300) % (n1 + 1))).astype(np.float64)
    weights = fit_shares(votes)
    np.testing.assert_allclose(weights, _em(votes), rtol=1e-9, atol=1e-12)
    # The same votes in another order are the same fit, shared and read-only.
    again = fit_shares(votes[::-1].copy())
    assert again is weights and not weights.flags.writeable
    assert not np.allclose(fit_shares(votes[:150]), weights)


def test_bad_refit_every_is_refused() -> None:
    with pytest.raises(ValueError):
        VoteWorth(refit_every=0)
