"""Per-question uncertainty scores of ASC and PPR-1v1, in log space.

Both depend only on the two largest vote counts (and, for PPR-1v1, on the distinct
answers seen), so they are memoised per state. Scalars go through
``scipy.special.cython_special``: the ufuncs' kernels without their call overhead.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import special
from scipy.special import cython_special

__all__ = ["asc_log_uncertainty", "ppr_log_uncertainty"]

_LOG2 = math.log(2.0)
# Below this the regularised incomplete beta is computed as a log-sum instead.
_UNDERFLOW = 1e-280


@lru_cache(maxsize=1 << 16)
def asc_log_uncertainty(n1: int, n2: int) -> float:
    """Log of ASC's ``P[p1 < p2] = I_{1/2}(n1 + 1, n2 + 1)`` for the top two counts ``n1 >= n2``.

    Larger means less sure; finite and strictly ordered for counts up to at least 100,000.
    """
    value = float(cython_special.betainc(n1 + 1.0, n2 + 1.0, 0.5))
    if value > _UNDERFLOW:
        return math.log(value)
    # I_{1/2}(n1+1, n2+1) = P[Binomial(m, 1/2) <= n2] with m = n1 + n2 + 1.
    m = n1 + n2 + 1
    j = np.arange(n2 + 1, dtype=np.float64)
    log_terms = special.gammaln(m + 1) - special.gammaln(j + 1) - special.gammaln(m - j + 1)
    return float(special.logsumexp(log_terms)) - m * _LOG2


@lru_cache(maxsize=1 << 16)
def ppr_log_uncertainty(n1: int, n2: int, num_distinct: int) -> float:
    """Log of PPR-1v1's ``(max(2, K) - 1) * BetaPDF(1/2; n1 + 1, n2 + 1)``, K distinct answers.

    The paper writes ``min(2, K)``, which zeroes the score of a question with a single
    answer seen; ``max`` keeps it finite. Larger means less sure; settling at error
    delta is ``score <= log(delta)``.
    """
    return (
        math.log(max(2, num_distinct) - 1)
        - (n1 + n2) * _LOG2
        - float(cython_special.betaln(n1 + 1.0, n2 + 1.0))
    )
