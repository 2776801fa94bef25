"""The journal's settings (pydantic-settings: bad environment fails before anything connects).

=================================  ===============================================
``TEMPORALITY_JOURNAL_HOST``        bind address of the HTTP API (``127.0.0.1``)
``TEMPORALITY_JOURNAL_PORT``        its port (``8082``; ``0`` picks a free one)
``TEMPORALITY_DATABASE_URL``        SQLAlchemy URL of the read model; SQLite by default,
                                    ``postgresql+asyncpg://user@host/db`` in deployment
                                    (``postgresql://`` and ``sqlite://`` are accepted too)
``TEMPORALITY_DATABASE_SSLMODE``    TLS to PostgreSQL, libpq's ``sslmode`` (``disable`` … ``verify-full``);
                                    unset: the URL's ``?sslmode=``, else asyncpg's ``prefer``
``TEMPORALITY_DATABASE_SSLROOTCERT``  the CA file the server's certificate must chain to
``TEMPORALITY_DATABASE_SSLCERT``    a client certificate (PEM), with ``…_SSLKEY`` its key
``TEMPORALITY_DATABASE_SSLKEY``     (all four win over the URL's query; :class:`~temporality_journal.database.DatabaseTls`)
``TEMPORALITY_JOURNAL_SQLITE_SYNCHRONOUS``  SQLite's ``PRAGMA synchronous`` on every connection: ``normal``
                                    (the default: a power cut may take the last commits) or ``full``
                                    (fsync at every commit); ``off`` is refused
``TEMPORALITY_JOURNAL_POSTGRES_SYNCHRONOUS_COMMIT``  PostgreSQL's ``synchronous_commit`` on every connection
                                    (``on``, ``off``, ``local``, ``remote_write``, ``remote_apply``);
                                    unset: the server's (:class:`~temporality_journal.database.DatabaseDurability`)
``TEMPORALITY_JOURNAL_BATCH_SIZE``  events recorded per transaction, at most (``1000``; the consumer bounds it to
                                    half the durable's ``max_ack_pending``: 500 while that is 1,000)
``TEMPORALITY_JOURNAL_BATCH_LINGER_MS``  a fetch short of the batch size waits this long once for more
                                    events (``20``; ``0``: none): fewer, larger transactions at a
                                    steady trickle, each event journaled up to this much later
``TEMPORALITY_JOURNAL_RETENTION_DAYS``  purge finished runs (rows and events) older than this
                                    many days; ``0`` keeps everything (the default;
                                    :mod:`temporality_journal.retention`)
``TEMPORALITY_JOURNAL_AUDIT_RETENTION_DAYS``  purge audited events (``GET /audit``) older than this; ``0``
                                    keeps them forever (the default); the table retention never
                                    purges them
``TEMPORALITY_JOURNAL_BEHIND_WARN_EVENTS``  the console says "recording N events behind the bus" above this
                                    many events not yet recorded (``1000``; ``/readyz``'s ``backlog``,
                                    :mod:`temporality_journal.backlog`)
``TEMPORALITY_JOURNAL_GATEWAY_URL``  the trigger-gateway's URL (``http://127.0.0.1:8080``), for the
                                    console's trigger wizard (``/gateway/...``,
                                    :mod:`temporality_journal.gateway`); unset: those routes are 503
``TEMPORALITY_JOURNAL_HUMAN_URL``   human-interaction's URL (``http://127.0.0.1:8081``), for the
                                    console's web inbox (``/human/...``,
                                    :mod:`temporality_journal.human`); unset: those routes are 503
``TEMPORALITY_JOURNAL_OIDC_*``      sign-in with an OIDC provider (optional; unset issuer: none):
                                    ``ISSUER``, ``CLIENT_ID``, ``CLIENT_SECRET_FILE``, ``SCOPES``,
                                    ``REDIRECT_BASE_URL``, ``PROVIDER_NAME``, ``USER_CLAIM``,
                                    ``ROLES_CLAIM``, ``ROLE_MAP``, ``DIRECTORY_ROLES``
                                    (:mod:`temporality_journal.signin`)
``TEMPORALITY_JOURNAL_PASSWORD_*``  sign-in with a directory account's password (optional; human-interaction
                                    checks it): ``SIGNIN``, ``MAX_FAILURES``,
                                    ``MAX_FAILURES_PER_ADDRESS``, ``WINDOW_S``
                                    (:mod:`temporality_journal.passwords`)
``TEMPORALITY_JOURNAL_SESSION_*``   the sign-in session cookie: ``SECRET_FILE``, ``MAX_AGE_S``,
                                    ``COOKIE_SECURE``, ``DIRECTORY_CHECK_S``
                                    (:mod:`temporality_journal.directory_sessions`)
``TEMPORALITY_INBOX_VOUCH_SECRET_FILE``  shared with human-interaction: the journal vouches for a
                                    signed-in person's inbox calls (:mod:`temporality_service.vouch`)
``TEMPORALITY_API_TOKENS_FILE``     the role tokens the API and console admit
                                    (:class:`temporality_service.ApiAuthSettings`)
``TEMPORALITY_NATS_*``              :class:`temporality_bus.NatsSettings`
``TEMPORALITY_LOG_*``               :class:`temporality_service.LogSettings`
``TEMPORALITY_READY_FILE``          :class:`temporality_service.ProcessSettings`
=================================  ===============================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AnyHttpUrl, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from temporality_journal.database import (
    DatabaseDurability,
    DatabaseTls,
    PostgresSynchronousCommit,
    SqliteSynchronous,
    SslMode,
)
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
    database_sslmode: SslMode | None = Field(
        default=None,
        validation_alias="TEMPORALITY_DATABASE_SSLMODE",
        description="TLS to PostgreSQL (libpq's sslmode); unset: the URL's, else prefer",
    )
    database_sslrootcert: Path | None = Field(
        default=None,
        validation_alias="TEMPORALITY_DATABASE_SSLROOTCERT",
        description="CA certificate file (PEM) the database server's certificate must chain to",
    )
    database_sslcert: Path | None = Field(
        default=None, validation_alias="TEMPORALITY_DATABASE_SSLCERT", description="client certificate (PEM)"
    )
    database_sslkey: Path | None = Field(
        default=None, validation_alias="TEMPORALITY_DATABASE_SSLKEY", description="the client certificate's key"
    )
    sqlite_synchronous: SqliteSynchronous = Field(
        default="normal",
        description="SQLite's PRAGMA synchronous on every connection: normal (WAL fsynced at checkpoints: a power "
        "cut may take the last commits) or full (fsync at every commit); off is refused (a power cut may corrupt "
        "the file); ignored with PostgreSQL",
    )
    postgres_synchronous_commit: PostgresSynchronousCommit | None = Field(
        default=None,
        description="PostgreSQL's synchronous_commit on every connection (on, off, local, remote_write, "
        "remote_apply); unset: the server's or role's own; ignored with SQLite",
    )
    # at most 1,000; the consumer bounds a batch to half the durable's max_ack_pending (the journal's: 2,000 in the
    # catalogue, so batches of 1,000), so the next batch can be prefetched while one is recorded
    # (temporality_bus.consumer._batch_within)
    batch_size: int = Field(default=1_000, ge=1, le=1_000, description="events recorded per transaction, at most")
    batch_linger_ms: int = Field(
        default=20,
        ge=0,
        le=1_000,
        description="a fetch short of batch_size waits this long once for more events: fewer, larger transactions "
        "at a steady trickle, each event journaled up to this much later; 0: none",
    )
    behind_warn_events: int = Field(
        default=1_000,
        ge=0,
        description="the console says it is recording N events behind the bus above this many events its durable "
        "consumer has not recorded yet (/readyz backlog.warn_above)",
    )
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

    # ------------------------------------------------------------------ sign-in (OIDC), issue 9
    oidc_issuer: AnyHttpUrl | None = Field(
        default=None,
        description="the OIDC provider's issuer URL (its /.well-known/openid-configuration is read); unset: no "
        "OIDC sign-in, API tokens only",
    )
    oidc_client_id: str | None = Field(default=None, min_length=1, max_length=255)
    oidc_client_secret_file: Path | None = Field(
        default=None, description="a file holding the client secret (mount it from a secret); never logged"
    )
    oidc_scopes: str = Field(default="openid email profile", pattern=r"(^| )openid( |$)")
    oidc_redirect_base_url: AnyHttpUrl | None = Field(
        default=None,
        description="the journal's URL as browsers reach it (https://journal.example.org); the provider redirects "
        "to <this>/auth/callback, which must be registered with the client",
    )
    oidc_provider_name: str = Field(default="OIDC", min_length=1, max_length=60, description="shown on the button")
    oidc_user_claim: str = Field(
        default="email",
        min_length=1,
        max_length=100,
        description="the ID token claim whose value is the directory user id of the person",
    )
    oidc_roles_claim: str = Field(
        default="groups", min_length=1, max_length=100, description="the claim listing the person's groups/roles"
    )
    oidc_role_map: dict[str, Literal["viewer", "operator", "admin"]] = Field(
        default_factory=dict,
        description='JSON {"<value in the roles claim>": "viewer|operator|admin"}; the highest match wins; no '
        "match: the person gets only their inbox",
    )
    password_signin: bool = Field(
        default=False,
        description="people sign in with their directory user id and password (human-interaction checks it over "
        "the bus; roles from the directory's console_role); needs TEMPORALITY_JOURNAL_SESSION_SECRET_FILE",
    )
    password_max_failures: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="failed password sign-ins per user id from one client address within the window, then 429 (ten times as many for the user id from any addresses)",
    )
    password_max_failures_per_address: int = Field(
        default=20, ge=1, le=100_000, description="failed password sign-ins per client address within the window"
    )
    password_window_s: int = Field(
        default=900,
        ge=1,
        le=86_400,
        description="the window of the failure limits, in seconds (shared by the replicas)",
    )
    oidc_directory_roles: bool = Field(
        default=False,
        description="an OIDC sign-in whose groups the role map gives no role takes the directory profile's "
        "console_role (asked of human-interaction); the role map, when it gives one, always wins",
    )
    session_secret_file: Path | None = Field(
        default=None,
        description="the key signing the session cookie (at least 32 characters); needed with OIDC or passwords",
    )
    session_max_age_s: int = Field(default=8 * 3600, ge=60, le=7 * 24 * 3600)
    session_directory_check_s: float = Field(
        default=2.0,
        ge=0,
        le=300,
        description="how long the directory's answer about a person signed in with a password (or a directory "
        "role) is reused before it is asked again; a role or password change, or the account's removal, ends "
        "their sessions at their first request after that (0: ask at every request)",
    )
    session_cookie_secure: bool | None = Field(
        default=None,
        description="the cookie's Secure flag; unset: set when the OIDC redirect base URL is https, and always "
        "with password sign-in alone (set false to sign in over plain http, e.g. on loopback)",
    )
    inbox_vouch_secret_file: Path | None = Field(
        default=None,
        validation_alias="TEMPORALITY_INBOX_VOUCH_SECRET_FILE",
        description="shared with human-interaction: the journal vouches for a signed-in person's inbox calls",
    )

    def database_tls(self) -> DatabaseTls:
        """The TLS settings for :meth:`temporality_journal.database.Database.open` (over the URL's)."""
        return DatabaseTls(
            sslmode=self.database_sslmode,
            sslrootcert=self.database_sslrootcert,
            sslcert=self.database_sslcert,
            sslkey=self.database_sslkey,
        )

    def database_durability(self) -> DatabaseDurability:
        """The commit modes for :meth:`temporality_journal.database.Database.open`."""
        return DatabaseDurability(
            sqlite_synchronous=self.sqlite_synchronous, postgres_synchronous_commit=self.postgres_synchronous_commit
        )

    @field_validator(
        "sqlite_synchronous",
        "postgres_synchronous_commit",
        mode="before",
    )
    @classmethod
    def _lower_case(cls, value: Any, info: ValidationInfo) -> Any:
        """``FULL`` as ``full`` (SQLite and PostgreSQL take either case); empty is unset (the default)."""
        if isinstance(value, str):
            value = value.strip().lower()
            if not value:
                return "normal" if info.field_name == "sqlite_synchronous" else None
        return value

    @field_validator(
        "gateway_url",
        "human_url",
        "oidc_issuer",
        "oidc_redirect_base_url",
        "database_sslmode",
        "database_sslrootcert",
        "database_sslcert",
        "database_sslkey",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _oidc_complete(self) -> Settings:
        if self.password_signin and self.session_secret_file is None:
            raise ValueError(
                "TEMPORALITY_JOURNAL_PASSWORD_SIGNIN is set: also set TEMPORALITY_JOURNAL_SESSION_SECRET_FILE"
            )
        if self.oidc_issuer is None:
            return self
        missing = [
            f"TEMPORALITY_JOURNAL_{name.upper()}"
            for name in ("oidc_client_id", "oidc_client_secret_file", "oidc_redirect_base_url", "session_secret_file")
            if getattr(self, name) is None
        ]
        if missing:
            raise ValueError(f"TEMPORALITY_JOURNAL_OIDC_ISSUER is set: also set {', '.join(missing)}")
        return self
