"""``TEMPORALITY_HUMAN_*``: the human-interaction process's settings (bad env fails before connecting)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
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
