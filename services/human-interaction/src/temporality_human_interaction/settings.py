"""``TEMPORALITY_HUMAN_*``: the human-interaction process's settings (bad env fails before connecting).

Channel credentials come from the environment only and are ``SecretStr`` (never logged). A chat
adapter starts only when its credentials are set: Telegram with ``TELEGRAM_TOKEN``; Matrix with
``MATRIX_HOMESERVER`` + ``MATRIX_USER_ID`` + one of ``MATRIX_PASSWORD`` / ``MATRIX_ACCESS_TOKEN``.
The web inbox always runs.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from temporality_service import HttpServiceSettings

__all__ = ["Settings"]


class Settings(HttpServiceSettings):
    """Answers are a handful of bytes: the runtime's default ``max_body_bytes`` (64 KiB) refuses more with 413."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_HUMAN_", extra="ignore", populate_by_name=True)

    port: int | None = Field(default=8081, ge=0, le=65535)
    users_file: Path = Field(default=Path("config/users.yaml"), description="The user directory (YAML)")
    #: An HTTP call never waits longer than this on NATS; past it the API answers 503.
    bus_timeout_s: float = Field(default=5.0, gt=0)
    #: How many ``human.requested`` messages (and, apart, ``run.requested`` policies) are handled concurrently.
    max_inflight: int = Field(default=8, gt=0)
    #: An answer's repair timer fires this long after the answer is bound and announces it if the
    #: ``human.answered`` publish was lost (a crash or a bus timeout right after the answer was stored).
    answer_repair_after_s: float = Field(default=30.0, gt=0, le=300)  # within the 10-min dedupe window

    #: Answered / expired / cancelled requests are kept this long after they ended (and at least until their
    #: deadline passed), then purged by a sweep every ``retention_sweep_every_s``.
    request_retention_days: float = Field(default=30.0, gt=0, le=3650)
    retention_sweep_every_s: float = Field(default=3600.0, ge=1, le=7 * 24 * 3600)
    #: SEC-1: how many deliveries a ``human.requested`` / ``human.notify_requested`` waits for its run's
    #: ``run.requested`` policy (backoff 0.5, 1, 2, 5 s: the default waits ~8.5 s) before it is refused.
    policy_wait_deliveries: int = Field(default=5, ge=1, le=7)

    # ------------------------------------------------------------------ egress policy (HUM-5, SEC-1)
    #: Per channel, the characters each text field (context, question, ...) keeps before it is truncated with
    #: a visible marker; JSON, e.g. ``{"telegram": 600}`` (merged over the defaults of :mod:`.egress`).
    egress_max_chars: dict[str, int] = Field(default_factory=dict)
    #: The limit for a channel ``egress_max_chars`` and the defaults do not name.
    egress_default_max_chars: int = Field(default=1000, ge=40, le=100_000)
    #: Extra secret patterns, JSON ``{"<kind>": "<regex>"}``; checked at start (a bad regex: exit 2).
    egress_redact_patterns: dict[str, str] = Field(default_factory=dict)

    #: The web inbox's address as people open it (the console's ``https://<host>/#/inbox``): a chat question cut to
    #: fit the chat's message limit links it ("full question in the inbox"). Unset: the cut is only marked.
    inbox_url: str | None = Field(default=None, max_length=500, pattern=r"^https?://\S+$")

    #: Shared with the journal: it vouches for the person signed in to the console (OIDC) with assertions signed
    #: with this secret (``temporality_service.vouch``); unset: the web inbox takes inbox tokens only.
    inbox_vouch_secret_file: Path | None = Field(default=None, validation_alias="TEMPORALITY_INBOX_VOUCH_SECRET_FILE")

    # ------------------------------------------------------------------ Telegram (HUM-3)
    #: The bot token from @BotFather; unset: no Telegram adapter.
    telegram_token: SecretStr | None = None
    #: The Bot API endpoint prefix; a call goes to ``<base_url><token>/<method>`` (tests: the emulator).
    telegram_base_url: str = "https://api.telegram.org/bot"
    #: The long-poll ``timeout`` of ``getUpdates``, seconds.
    telegram_poll_timeout_s: float = Field(default=10.0, ge=0, le=50)

    #: Issue 11: one replica at a time polls (the others only send); its lease in ``human-channels`` lasts
    #: this long past its holder's last renewal, renewed every ``channel_lease_renew_s`` (:mod:`.channels.lease`).
    channel_lease_ttl_s: float = Field(default=15.0, ge=1, le=300)
    channel_lease_renew_s: float = Field(default=3.0, gt=0, le=100)
    #: Who this replica is as a lease holder: something stable across its restarts and unique among the replicas
    #: (the chart sets the pod's name), so a replica restarted after a crash takes its own lease back at once
    #: instead of after the ttl. Unset: a new id per process (``<host>/<pid>/<random>``). Never the same for two
    #: running replicas: both would poll.
    channel_lease_holder: str | None = Field(default=None, min_length=1, max_length=200)

    # ------------------------------------------------------------------ Matrix (HUM-3)
    #: The homeserver's client URL (``https://matrix.example.org``); unset: no Matrix adapter.
    matrix_homeserver: str | None = None
    #: The bot's Matrix user id (``@temporality:example.org``).
    matrix_user_id: str | None = None
    #: Log in with this password ... (one of the two is required with a homeserver)
    matrix_password: SecretStr | None = None
    #: ... or use this access token.
    matrix_access_token: SecretStr | None = None
    #: The long-poll ``timeout`` of ``/sync``, seconds.
    matrix_sync_timeout_s: float = Field(default=10.0, ge=0, le=60)

    @field_validator("egress_max_chars")
    @classmethod
    def _limits_usable(cls, value: dict[str, int]) -> dict[str, int]:
        for channel, limit in value.items():
            if not 40 <= limit <= 100_000:
                raise ValueError(f"egress_max_chars[{channel}]: {limit} is not between 40 and 100000")
        return value

    @field_validator("channel_lease_renew_s")
    @classmethod
    def _renewed_in_time(cls, value: float, info: ValidationInfo) -> float:
        ttl = info.data.get("channel_lease_ttl_s")
        if ttl is not None and value >= ttl / 2:
            raise ValueError(f"must be under half of channel_lease_ttl_s ({ttl})")
        return value

    @property
    def telegram_enabled(self) -> bool:
        return self.telegram_token is not None and bool(self.telegram_token.get_secret_value())
