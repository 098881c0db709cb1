"""Service settings: read from ``BLENDSERVE_*`` environment variables once, then passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    data: Path | None = None
    embedded_model: str = "qwen2.5-coder-0.5b"
    model_cache_dir: Path = Path.home() / ".cache" / "blendserve" / "models"
    vllm_model: str | None = None
    default_concurrency: int = Field(64, ge=1, description="samples in flight per job")
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
        )
