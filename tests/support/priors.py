"""Vote priors for tests: fitted to chosen leader shares, and caches emptied."""

from __future__ import annotations

import numpy as np
import pytest
from blendserve.core import programme
from blendserve.core.programme import VotePrior

__all__ = ["fitted_prior", "no_built_programmes"]


def fitted_prior(shares: list[float], votes: int = 16, seed: int = 0) -> VotePrior:
    """A prior fitted to questions of these leader shares, ``votes`` top-two votes each."""
    rng = np.random.default_rng(seed)
    prior = VotePrior(refit_every=10_000)
    for x in shares:
        first = int(rng.binomial(votes, x))
        prior.observe(max(first, votes - first), min(first, votes - first), votes)
    prior.fit()
    return prior


def no_built_programmes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empties the process's programmes and start prices for the test."""
    monkeypatch.setattr(programme, "_PROGRAMMES", programme._Programmes())
    monkeypatch.setattr(programme, "_START_PRICES", {})
