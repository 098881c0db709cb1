"""Engines: one interface over OpenAI-compatible upstreams, vLLM in-process and replay."""

from blendserve.engines.base import Engine, EngineHealth, GenerateRequest, Sample, SamplingParams
from blendserve.engines.config import Health, Limits, RetryPolicy, Timeouts
from blendserve.engines.passthrough import PassThrough

__all__ = [
    "Engine",
    "EngineHealth",
    "GenerateRequest",
    "Health",
    "Limits",
    "PassThrough",
    "RetryPolicy",
    "Sample",
    "SamplingParams",
    "Timeouts",
]
