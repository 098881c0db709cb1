"""How flat a batch's or a pool's answers are, and the uniform start that follows from it.

On flat answer distributions adaptive policies starve questions whose first samples
agree by chance; a uniform start protects them, and only costs samples on peaked data.
The share of questions whose first two samples disagree tells the two apart
(docs/policies.md, "The default policy").
"""

from __future__ import annotations

__all__ = ["PROBE", "Flatness", "cap_multiple", "floor_share"]

#: Samples of a question whose agreement measures flatness.
PROBE = 2

# Disagreement at which a batch starts to count as flat, and at which it is fully flat.
_FLAT_FROM = 0.2
_FLAT_TO = 0.5
# A fully flat batch's floor (a share of the budget).
_MAX_SHARE = 0.5
# cap = _CAP_SCALE / disagreement (multiples of the mean samples).
_CAP_SCALE = 2.5


def _ramp(disagreement: float) -> float:
    """0 up to a disagreement of 0.2 (peaked), rising linearly to 1 at 0.5 and above (flat)."""
    ramp = (disagreement - _FLAT_FROM) / (_FLAT_TO - _FLAT_FROM)
    return min(1.0, max(0.0, ramp))


def floor_share(disagreement: float) -> float:
    """Share of the mean budget every question gets uniformly: 0 when peaked, half when flat."""
    return _MAX_SHARE * _ramp(disagreement)


def cap_multiple(disagreement: float) -> float | None:
    """Most samples a question may hold, as a multiple of the mean: 2.5 / disagreement.

    Only contested questions need more than a few samples, so each may take about 2.5
    times its share: in a peaked batch hardly a cap (None past 1,000); on flat data, where
    near-ties never resolve, the samples past it go to questions that only look sure.
    """
    if disagreement * 1000.0 <= _CAP_SCALE:
        return None
    return _CAP_SCALE / disagreement


class Flatness:
    """A running estimate of the disagreement of finished questions, from a cautious prior.

    The prior counts as ``prior_weight`` questions that disagreed at ``prior``: until a
    few questions have finished, a stream starts as if its answers were flat (the safe
    side: a larger first wave costs samples, a smaller one on flat data accuracy).
    """

    def __init__(self, prior: float = 0.5, prior_weight: float = 10.0) -> None:
        if not 0.0 <= prior <= 1.0 or not prior_weight >= 0.0:
            raise ValueError("prior must be in [0, 1] and prior_weight at least 0")
        self._disagreed = prior * prior_weight
        self._weight = prior_weight
        self.num_questions = 0

    def observe(self, first_keys: tuple[object, ...]) -> None:
        """A question finished; ``first_keys`` are its first :data:`PROBE` answer keys.

        An abstention (None) counts as a disagreement; a question with fewer
        samples than the probe tells nothing and is not counted.
        """
        if len(first_keys) < PROBE:
            return
        self.num_questions += 1
        self._disagreed += None in first_keys or len(set(first_keys)) > 1

    @property
    def disagreement(self) -> float:
        """The estimated share of questions whose first two samples disagree."""
        weight = self._weight + self.num_questions
        return self._disagreed / weight if weight else 0.0

    @property
    def share(self) -> float:
        """:func:`floor_share` of the estimate."""
        return floor_share(self.disagreement)

    def cap(self, cap: float) -> float:
        """``cap`` (a multiple of the budget), lowered to :func:`cap_multiple` of the estimate."""
        learned = cap_multiple(self.disagreement)
        return cap if learned is None else min(cap, learned)
