"""run-executor settings (``TEMPORALITY_EXECUTOR_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from temporality_bus import LogSettings, NatsSettings, ProcessSettings

__all__ = ["Settings"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_EXECUTOR_", extra="ignore")

    agents_file: Path = Path("config/agents.yaml")
    #: Runs driven concurrently by this replica (a waiting run occupies nothing).
    max_inflight: int = Field(default=8, ge=1)
    #: Seconds the scripted provider "thinks" per turn, standing in for LLM latency (demos, crash tests).
    scripted_think_s: float = Field(default=0.0, ge=0)
    nats: NatsSettings = Field(default_factory=NatsSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    process: ProcessSettings = Field(default_factory=ProcessSettings)
