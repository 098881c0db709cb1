"""Allocation policies: which question gets the next sample of a shared budget."""

from blendserve.core.policies.base import AllocationPolicy
from blendserve.core.policies.blend import BlendPolicy
from blendserve.core.policies.priority import (
    ASCPolicy,
    ESCPolicy,
    OraclePolicy,
    PPRPolicy,
    PriorityPolicy,
    SCPolicy,
)
from blendserve.core.policies.spec import POLICIES, PolicySpec

__all__ = [
    "POLICIES",
    "ASCPolicy",
    "AllocationPolicy",
    "BlendPolicy",
    "ESCPolicy",
    "OraclePolicy",
    "PPRPolicy",
    "PolicySpec",
    "PriorityPolicy",
    "SCPolicy",
]
