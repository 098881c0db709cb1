"""The simulator: policies from the core, run on recorded or synthetic answer distributions."""

from blendserve.sim.data import DataError, Dataset, load_jsonl
from blendserve.sim.efficiency import Curve, MethodResult, TargetResult, sample_efficiency
from blendserve.sim.runner import AnswerDraws, run_policy
from blendserve.sim.synthetic import synthetic

__all__ = [
    "AnswerDraws",
    "Curve",
    "DataError",
    "Dataset",
    "MethodResult",
    "TargetResult",
    "load_jsonl",
    "run_policy",
    "sample_efficiency",
    "synthetic",
]
