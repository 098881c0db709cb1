"""Builds the configured engine: an upstream, vLLM in-process, replay or the embedded default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from blendserve.engines._retry import RetryPolicy
from blendserve.engines.base import Engine
from blendserve.engines.config import Limits, Timeouts
from blendserve.engines.engine_cost import EngineCost
from blendserve.stats import NO_STATS, Stats

__all__ = ["EngineConfig", "EngineKind", "build_engine"]

EngineKind = Literal["auto", "openai", "replay", "vllm", "embedded"]


@dataclass(frozen=True)
class EngineConfig:
    """Which engine to run and its settings: those of ``serve`` (docs/configuration.md).

    With ``kind="auto"``: upstream URLs give the OpenAI-compatible engine,
    recorded data the replay engine, a vLLM model vLLM in-process, and nothing
    the embedded llama.cpp default.

    Attributes (those that say more than their setting):
        model: model name sent upstream (None: the upstream's own); for vLLM in-process,
            the name it is served under (None: ``vllm_model``).
        timeouts: the upstreams' timeouts; ``call`` also bounds the embedded
            default's requests. A ``stall`` timeout streams upstream requests.
        retry: retries of an upstream request; ``max_retry_after`` is the
            longest ``Retry-After`` waited for.
        vllm_args: further ``AsyncEngineArgs`` fields.
        capacity: sequences the engine runs at once (None: the engine's own, if it knows).
        engine_profile: the prior of the engine's cost model, which a vLLM engine
            (upstream or in-process) refines from its own metrics.
    """

    kind: EngineKind = "auto"
    upstreams: tuple[str, ...] = ()
    model: str | None = None
    api_key: str | None = None
    timeouts: Timeouts = Timeouts()
    limits: Limits = Limits()
    retry: RetryPolicy = RetryPolicy()
    data: Path | None = None
    embedded_model: str = "qwen2.5-coder-0.5b"
    model_cache_dir: Path | None = None
    embedded_threads: int | None = None
    vllm_model: str | None = None
    vllm_args: Mapping[str, Any] = field(default_factory=dict)
    session_header: str | None = None
    replay_latency: float = 0.0
    replay_capacity: int | None = None
    replay_per_token_latency: float = 0.0
    replay_profile: str | None = None
    replay_time_scale: float = 1.0
    replay_lengths: str = "text"
    capacity: int | None = None
    engine_profile: str | None = None

    def resolved_kind(self) -> EngineKind:
        """The engine ``auto`` stands for, given the other settings."""
        if self.kind != "auto":
            return self.kind
        if self.upstreams:
            return "openai"
        if self.data is not None:
            return "replay"
        if self.vllm_model is not None:
            return "vllm"
        return "embedded"


async def build_engine(config: EngineConfig, sink: Stats = NO_STATS) -> Engine:
    """Creates (and for the embedded default, starts) the engine of ``config``.

    The engine reports to ``sink`` (the service passes its Prometheus sink).

    Raises:
        ValueError: the settings do not fit the engine (e.g. replay without data).
        EngineUnavailable: the engine cannot start (missing package or model).
    """
    engine = await _build(config, sink)
    if config.capacity is not None:
        engine.capacity = config.capacity
    engine.cost = _cost(config, sink)
    return engine


def _cost(config: EngineConfig, sink: Stats) -> EngineCost:
    """The engine's cost model: its profile, else the replay engine's own, else none yet.

    Raises:
        ValueError: the profile cannot be read.
    """
    from blendserve.engines.step_cost import load_step_cost

    if config.engine_profile is not None:
        return EngineCost(load_step_cost(config.engine_profile), sink=sink)
    if config.resolved_kind() == "replay" and config.replay_profile is not None:
        return EngineCost(load_step_cost(config.replay_profile), sink=sink)
    return EngineCost(sink=sink)


async def _build(config: EngineConfig, sink: Stats) -> Engine:
    kind = config.resolved_kind()
    if kind == "openai":
        if not config.upstreams:
            raise ValueError("the openai engine needs at least one --upstream URL")
        from blendserve.engines.openai import OpenAIEngine

        return OpenAIEngine(
            config.upstreams,
            model=config.model,
            api_key=config.api_key,
            stream=config.timeouts.stall is not None,
            session_header=config.session_header,
            timeouts=config.timeouts,
            limits=config.limits,
            retry=config.retry,
            sink=sink,
        )
    if kind == "replay":
        if config.data is None:
            raise ValueError("the replay engine needs --data FILE.jsonl")
        from blendserve.engines.replay import LENGTHS, LatencyModel, ReplayEngine
        from blendserve.engines.step_cost import load_step_cost

        profile = config.replay_profile
        latency = LatencyModel(
            fixed=config.replay_latency,
            per_token=config.replay_per_token_latency,
            max_concurrent_sequences=config.replay_capacity,
            length=LENGTHS[config.replay_lengths],
            step_cost=None if profile is None else load_step_cost(profile),
            time_scale=config.replay_time_scale,
        )
        return ReplayEngine(config.data, latency=latency, sink=sink)
    if kind == "vllm":
        if config.vllm_model is None:
            raise ValueError("the vllm engine needs --vllm-model NAME")
        from blendserve.engines.vllm_inprocess import VLLMEngine

        engine_args = {"model": config.vllm_model, **config.vllm_args}
        return VLLMEngine(engine_args, name=config.model, sink=sink)
    from blendserve.engines.embedded import create_embedded_engine

    return await create_embedded_engine(
        model=config.embedded_model,
        cache_dir=config.model_cache_dir,
        threads=config.embedded_threads,
        timeout=config.timeouts.call,
        sink=sink,
    )
