"""The NATS connection settings (pydantic-settings: bad env fails before connecting)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["NatsSettings"]


class NatsSettings(BaseSettings):
    """``TEMPORALITY_NATS_*``."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_NATS_", extra="ignore")

    url: str = Field(default="nats://127.0.0.1:4222", description="Comma-separated server URLs")
    #: The service's own NATS user (SEC-1: each service has its own, with the permissions its catalogue
    #: entry implies, see ``temporality_protocol.permissions``). Unset: connect without authentication.
    user: str | None = None
    password: SecretStr | None = None
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
