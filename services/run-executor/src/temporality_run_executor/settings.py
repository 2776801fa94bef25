"""run-executor settings (``TEMPORALITY_EXECUTOR_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from temporality_service import ServiceSettings

__all__ = ["Settings"]


class Settings(ServiceSettings):
    """A worker: no HTTP API. ``TEMPORALITY_EXECUTOR_PORT`` serves ``/healthz`` and ``/readyz`` for probes."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_EXECUTOR_", extra="ignore")

    agents_file: Path = Path("config/agents.yaml")
    #: Runs driven concurrently by this replica (a waiting run occupies nothing).
    max_inflight: int = Field(default=8, ge=1)
    #: Seconds the scripted provider "thinks" per turn, standing in for LLM latency (demos, crash tests).
    scripted_think_s: float = Field(default=0.0, ge=0)
