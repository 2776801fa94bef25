"""agent-collab's settings: ``TEMPORALITY_COLLAB_*`` plus the shared NATS, log and process settings."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from temporality_bus import LogSettings, NatsSettings, ProcessSettings

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Read from the environment at construction; a bad value fails before anything connects."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_COLLAB_", extra="ignore")

    nats: NatsSettings = Field(default_factory=NatsSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    process: ProcessSettings = Field(default_factory=ProcessSettings)
    #: Events the projector handles concurrently (CAS keeps concurrent updates of one saga correct).
    max_inflight: int = Field(default=8, ge=1)
    #: How long SIGTERM waits for requests already received by the responder.
    responder_drain_s: float = Field(default=5.0, gt=0)
