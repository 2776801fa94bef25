"""``TEMPORALITY_HUMAN_*``: the human-interaction process's settings (bad env fails before connecting).

Channel credentials come from the environment only and are ``SecretStr`` (never logged). A chat
adapter starts only when its credentials are set: Telegram with ``TELEGRAM_TOKEN``; Matrix with
``MATRIX_HOMESERVER`` + ``MATRIX_USER_ID`` + one of ``MATRIX_PASSWORD`` / ``MATRIX_ACCESS_TOKEN``.
The web inbox always runs.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from temporality_service import HttpServiceSettings

__all__ = ["Settings"]


class Settings(HttpServiceSettings):
    """Answers are a handful of bytes: the runtime's default ``max_body_bytes`` (64 KiB) refuses more with 413."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_HUMAN_", extra="ignore")

    port: int | None = Field(default=8081, ge=0, le=65535)
    users_file: Path = Field(default=Path("config/users.yaml"), description="The user directory (YAML)")
    #: An HTTP call never waits longer than this on NATS; past it the API answers 503.
    bus_timeout_s: float = Field(default=5.0, gt=0)
    #: How many ``human.requested`` messages are handled concurrently.
    max_inflight: int = Field(default=8, gt=0)
    #: An answer's repair timer fires this long after the answer is bound and announces it if the
    #: ``human.answered`` publish was lost (a crash or a bus timeout right after the answer was stored).
    answer_repair_after_s: float = Field(default=30.0, gt=0, le=300)  # within the 10-min dedupe window

    # ------------------------------------------------------------------ Telegram (HUM-3)
    #: The bot token from @BotFather; unset: no Telegram adapter.
    telegram_token: SecretStr | None = None
    #: The Bot API endpoint prefix; a call goes to ``<base_url><token>/<method>`` (tests: the emulator).
    telegram_base_url: str = "https://api.telegram.org/bot"
    #: The long-poll ``timeout`` of ``getUpdates``, seconds.
    telegram_poll_timeout_s: float = Field(default=10.0, ge=0, le=50)

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

    @property
    def telegram_enabled(self) -> bool:
        return self.telegram_token is not None and bool(self.telegram_token.get_secret_value())
