"""The pure core (no I/O): votes, and how a question's next samples are decided.

Its vocabulary, on docs/decisions.md: a learned prior (:mod:`~blendserve.core.prior`),
what further votes are worth (:mod:`~blendserve.core.worth`,
:mod:`~blendserve.core.programme`), a price (:mod:`~blendserve.core.price`) and waves
(:mod:`~blendserve.core.waves`). Policies decide a budgeted batch, the stopping rule a stream.
"""

from blendserve.core.policies import (
    DEFAULT_POLICY,
    POLICIES,
    AllocationPolicy,
    ASCPolicy,
    BlendPolicy,
    ESCPolicy,
    HedgePolicy,
    OraclePolicy,
    PolicySpec,
    PPRPolicy,
    SCPolicy,
)
from blendserve.core.price import PacedPrice
from blendserve.core.stopping import StoppingRule
from blendserve.core.uncertainty import asc_log_uncertainty, ppr_log_uncertainty
from blendserve.core.votes import VoteState

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "ASCPolicy",
    "AllocationPolicy",
    "BlendPolicy",
    "ESCPolicy",
    "HedgePolicy",
    "OraclePolicy",
    "PPRPolicy",
    "PacedPrice",
    "PacedThreshold",
    "PolicySpec",
    "SCPolicy",
    "StoppingRule",
    "VoteState",
    "asc_log_uncertainty",
    "ppr_log_uncertainty",
]

#: The name :class:`PacedPrice` had before it was named for what it paces.
PacedThreshold = PacedPrice
