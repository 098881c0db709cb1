"""The simulator: policies from the core, run on recorded or synthetic answer distributions."""

from blendserve.sim.clock import VirtualClockLoop, run_virtual
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
    "VirtualClockLoop",
    "load_jsonl",
    "run_policy",
    "run_virtual",
    "sample_efficiency",
    "synthetic",
]
