"""The journal's settings (pydantic-settings: bad environment fails before anything connects).

=================================  ===============================================
``TEMPORALITY_JOURNAL_HOST``        bind address of the HTTP API (``127.0.0.1``)
``TEMPORALITY_JOURNAL_PORT``        its port (``8082``; ``0`` picks a free one)
``TEMPORALITY_DATABASE_URL``        SQLAlchemy URL of the read model; SQLite by default,
                                    ``postgresql+asyncpg://user@host/db`` in deployment
                                    (``postgresql://`` and ``sqlite://`` are accepted too)
``TEMPORALITY_JOURNAL_BATCH_SIZE``  events recorded per transaction, at most (``256``)
``TEMPORALITY_JOURNAL_RETENTION_DAYS``  purge finished runs (rows and events) older than this
                                    many days; ``0`` keeps everything (the default;
                                    :mod:`temporality_journal.retention`)
``TEMPORALITY_JOURNAL_AUDIT_RETENTION_DAYS``  purge audited events (``GET /audit``) older than this; ``0``
                                    keeps them forever (the default); the table retention never
                                    purges them
``TEMPORALITY_JOURNAL_GATEWAY_URL``  the trigger-gateway's URL (``http://127.0.0.1:8080``), for the
                                    console's trigger wizard (``/gateway/...``,
                                    :mod:`temporality_journal.gateway`); unset: those routes are 503
``TEMPORALITY_JOURNAL_HUMAN_URL``   human-interaction's URL (``http://127.0.0.1:8081``), for the
                                    console's web inbox (``/human/...``,
                                    :mod:`temporality_journal.human`); unset: those routes are 503
``TEMPORALITY_API_TOKENS_FILE``     the role tokens the API and console admit
                                    (:class:`temporality_service.ApiAuthSettings`)
``TEMPORALITY_NATS_*``              :class:`temporality_bus.NatsSettings`
``TEMPORALITY_LOG_*``               :class:`temporality_service.LogSettings`
``TEMPORALITY_READY_FILE``          :class:`temporality_service.ProcessSettings`
=================================  ===============================================
"""

from __future__ import annotations

from typing import Any

from pydantic import AnyHttpUrl, Field, field_validator
from pydantic_settings import SettingsConfigDict

from temporality_service import HttpServiceSettings

__all__ = ["DEFAULT_DATABASE_URL", "Settings"]

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///.temporality/journal.db"


class Settings(HttpServiceSettings):
    """``TEMPORALITY_JOURNAL_*`` plus the shared ``TEMPORALITY_DATABASE_URL``."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_JOURNAL_", extra="ignore", populate_by_name=True)

    port: int | None = Field(default=8082, ge=0, le=65535)
    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        min_length=1,
        validation_alias="TEMPORALITY_DATABASE_URL",
        description="SQLAlchemy async URL (sqlite+aiosqlite:///path or postgresql+asyncpg://...)",
    )
    # at most the consumer's max_ack_pending (1,000): a larger fetch is never filled and waits out its timeout
    batch_size: int = Field(default=256, ge=1, le=1_000, description="events recorded per transaction, at most")
    retention_days: int = Field(
        default=0,
        ge=0,
        le=36_500,
        description="purge finished runs' rows and events finished more than this many days ago; 0 keeps all",
    )
    audit_retention_days: int = Field(
        default=0,
        ge=0,
        le=36_500,
        description="purge audited events (GET /audit) older than this many days; 0 keeps them forever (the table "
        "retention never purges them)",
    )
    gateway_url: AnyHttpUrl | None = Field(
        default=None,
        description="the trigger-gateway's URL the /gateway/ routes forward to; unset (or empty): they answer 503",
    )

    human_url: AnyHttpUrl | None = Field(
        default=None,
        description="human-interaction's URL the /human/ (web inbox) routes forward to; unset (or empty): they "
        "answer 503",
    )

    @field_validator("gateway_url", "human_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value
