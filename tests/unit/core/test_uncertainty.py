import itertools
import math

import pytest
from blendserve.core import asc_log_uncertainty, ppr_log_uncertainty
from scipy import stats


@pytest.mark.parametrize("n1,n2", [(0, 0), (1, 0), (1, 1), (3, 1), (7, 5), (20, 3), (64, 60)])
def test_asc_matches_beta_cdf(n1: int, n2: int) -> None:
    expected = stats.beta.cdf(0.5, n1 + 1, n2 + 1)
    assert math.exp(asc_log_uncertainty(n1, n2)) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize(
    "n1,n2,k", [(0, 0, 0), (1, 0, 1), (1, 1, 2), (3, 1, 2), (5, 2, 4), (40, 38, 7)]
)
def test_ppr_matches_beta_pdf_times_k_minus_one(n1: int, n2: int, k: int) -> None:
    expected = (max(2, k) - 1) * stats.beta.pdf(0.5, n1 + 1, n2 + 1)
    assert math.exp(ppr_log_uncertainty(n1, n2, k)) == pytest.approx(expected, rel=1e-10)


def test_ppr_with_one_answer_seen_is_not_degenerate() -> None:
    # min(2, K) would make this 0 for K = 1; max(2, K) keeps the factor 1.
    assert ppr_log_uncertainty(3, 0, 1) == ppr_log_uncertainty(3, 0, 2)
    assert math.isfinite(ppr_log_uncertainty(3, 0, 1))


def test_asc_log_space_where_the_cdf_underflows() -> None:
    # Regularised beta below 1e-280 is computed as a binomial log-sum.
    value = asc_log_uncertainty(2000, 3)
    n = 2004
    exact = math.log(sum(math.comb(n, j) for j in range(4))) - n * math.log(2)
    assert value == pytest.approx(exact, rel=1e-9)


def test_huge_counts_stay_finite_and_ordered() -> None:
    counts = [(100_000, 0), (99_999, 0), (100_000, 1), (60_000, 40_000), (50_001, 50_000)]
    asc = [asc_log_uncertainty(a, b) for a, b in counts]
    ppr = [ppr_log_uncertainty(a, b, 2) for a, b in counts]
    assert all(math.isfinite(v) for v in asc + ppr)
    # More agreement is surer: each state is less uncertain than the next one.
    assert asc[0] < asc[1] < asc[2] < asc[3] < asc[4]
    assert ppr[0] < ppr[1] < ppr[2] < ppr[3] < ppr[4]
    assert asc[4] == pytest.approx(math.log(0.5), abs=0.01)


def test_asc_strictly_decreasing_in_leader_votes() -> None:
    values = [asc_log_uncertainty(n1, 5) for n1 in range(5, 2000, 7)]
    assert all(b < a for a, b in itertools.pairwise(values))
