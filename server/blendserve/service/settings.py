"""Service settings: read from ``BLENDSERVE_*`` environment variables once, then passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from blendserve.engines.factory import EngineConfig, EngineKind

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Everything the service reads from its environment (``BLENDSERVE_<FIELD>``).

    Command-line flags of ``blendserve serve`` override these.
    """

    model_config = SettingsConfigDict(env_prefix="BLENDSERVE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    engine: EngineKind = "auto"
    upstreams: Annotated[tuple[str, ...], NoDecode] = ()
    model: str | None = None
    upstream_api_key: str | None = None
    upstream_timeout: float = Field(600.0, gt=0)
    session_header: str | None = Field(None, description="question id header (session routing)")
    data: Path | None = None
    embedded_model: str = "qwen2.5-coder-0.5b"
    model_cache_dir: Path = Path.home() / ".cache" / "blendserve" / "models"
    vllm_model: str | None = None
    default_concurrency: int = Field(64, ge=1, description="samples in flight per job")
    # The OpenAI-compatible routes: self-consistency defaults and request grouping.
    sc_budget_per_question: float = Field(8.0, gt=0, description="samples per question")
    sc_policy: str = "blend"
    sc_answer: Literal["auto", "number", "math", "choice", "exact"] = "auto"
    sc_settle_delta: float = Field(0.0, ge=0, lt=1)
    group_wait_ms: float = Field(50.0, ge=0, description="how long a group waits for more")
    group_max: int = Field(256, ge=1, description="questions that start a group at once")
    log_level: str = "info"

    @field_validator("upstreams", mode="before")
    @classmethod
    def _split_urls(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(url.strip() for url in value.split(",") if url.strip())
        return value

    def engine_config(self) -> EngineConfig:
        """The engine part of these settings."""
        return EngineConfig(
            kind=self.engine,
            upstreams=self.upstreams,
            model=self.model,
            api_key=self.upstream_api_key,
            timeout=self.upstream_timeout,
            data=self.data,
            embedded_model=self.embedded_model,
            model_cache_dir=self.model_cache_dir,
            vllm_model=self.vllm_model,
            session_header=self.session_header,
        )
