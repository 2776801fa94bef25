"""Settings shared by every service process (pydantic-settings: bad env fails before connecting)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["LogSettings", "NatsSettings", "ProcessSettings"]


class NatsSettings(BaseSettings):
    """``TEMPORALITY_NATS_*``."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_NATS_", extra="ignore")

    url: str = Field(default="nats://127.0.0.1:4222", description="Comma-separated server URLs")
    connect_timeout_s: float = 5.0
    max_reconnect_attempts: int = -1  # forever
    reconnect_wait_s: float = 1.0
    #: Well below Kubernetes' 30 s grace period (see notes: the drain gotcha).
    drain_timeout_s: float = 10.0
    #: How long a consumer waits for an ack before redelivering; in-progress pings extend it.
    ack_wait_s: float = 30.0

    @property
    def servers(self) -> list[str]:
        return [u.strip() for u in self.url.split(",") if u.strip()]


class LogSettings(BaseSettings):
    """``TEMPORALITY_LOG_*``."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_LOG_", extra="ignore")

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console"] = "json"


class ProcessSettings(BaseSettings):
    """``TEMPORALITY_*`` settings every service process understands."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_", extra="ignore")

    #: Written (with the pid) once the service is connected, has ensured the layout and is consuming /
    #: serving; the embedded launcher and the tests wait on it. Kubernetes uses HTTP probes instead.
    ready_file: Path | None = None
