"""Allocation policies: which question gets the next sample of a shared budget."""

from blendserve.core.policies.base import AllocationPolicy
from blendserve.core.policies.blend import BlendPolicy
from blendserve.core.policies.hedge import HedgePolicy
from blendserve.core.policies.priority import (
    ASCPolicy,
    ESCPolicy,
    OraclePolicy,
    PPRPolicy,
    PriorityPolicy,
    SCPolicy,
)
from blendserve.core.policies.spec import DEFAULT_POLICY, POLICIES, PolicySpec, policy_pattern

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
    "PolicySpec",
    "PriorityPolicy",
    "SCPolicy",
    "policy_pattern",
]
