"""agent-collab's settings: ``TEMPORALITY_COLLAB_*`` plus the shared NATS, log and process settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from temporality_service import ServiceSettings

__all__ = ["Settings"]


class Settings(ServiceSettings):
    """A worker: no HTTP API. ``TEMPORALITY_COLLAB_PORT`` serves ``/healthz`` and ``/readyz`` for probes."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_COLLAB_", extra="ignore")

    #: Events the projector handles concurrently (CAS keeps concurrent updates of one saga correct).
    max_inflight: int = Field(default=8, ge=1)
    #: The allow-list of external agents (AP-3); unset: ``config/external-agents.yaml`` if it exists, else none.
    external_agents_file: Path | None = None
    #: An external agent goes offline this long after its heartbeat interval passed without one (AP-4).
    heartbeat_grace_s: float = Field(default=2.0, ge=0)
