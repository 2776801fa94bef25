"""The journal's settings (pydantic-settings: bad environment fails before anything connects).

=================================  ===============================================
``TEMPORALITY_JOURNAL_HOST``        bind address of the HTTP API (``127.0.0.1``)
``TEMPORALITY_JOURNAL_PORT``        its port (``8082``; ``0`` picks a free one)
``TEMPORALITY_DATABASE_URL``        SQLAlchemy URL of the read model; SQLite by default,
                                    ``postgresql+asyncpg://user@host/db`` in deployment
                                    (``postgresql://`` and ``sqlite://`` are accepted too)
``TEMPORALITY_JOURNAL_BATCH_SIZE``  events recorded per transaction, at most (``256``)
``TEMPORALITY_API_TOKENS_FILE``     the role tokens the API and console admit
                                    (:class:`temporality_service.ApiAuthSettings`)
``TEMPORALITY_NATS_*``              :class:`temporality_bus.NatsSettings`
``TEMPORALITY_LOG_*``               :class:`temporality_service.LogSettings`
``TEMPORALITY_READY_FILE``          :class:`temporality_service.ProcessSettings`
=================================  ===============================================
"""

from __future__ import annotations

from pydantic import Field
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
    batch_size: int = Field(default=256, ge=1, le=10_000, description="events recorded per transaction, at most")
