"""The pure core: vote state, uncertainties and allocation policies (no I/O)."""

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
from blendserve.core.stopping import PacedThreshold, StoppingRule
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
    "PacedThreshold",
    "PolicySpec",
    "SCPolicy",
    "StoppingRule",
    "VoteState",
    "asc_log_uncertainty",
    "ppr_log_uncertainty",
]
