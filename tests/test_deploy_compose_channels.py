"""docker compose's way to the chat channels (issue 8: connecting a real Telegram bot and Matrix homeserver is
documented step by step): ``deploy/compose/channels.env`` (or ``$CHANNELS_ENV_FILE``) is read by
human-interaction only, ships nothing set (the web inbox only, as ``make up``), and the settings its commented
examples name are the ones human-interaction reads: uncommented, they configure both adapters."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from temporality_human_interaction.__main__ import check_channel_settings
from temporality_human_interaction.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CHANNELS_ENV = ROOT / "deploy" / "compose" / "channels.env"
REFERENCE = "${CHANNELS_ENV_FILE:-./deploy/compose/channels.env}"
_SETTING = re.compile(r"([A-Z][A-Z0-9_]*)='([^']*)'")


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    return doc


def _settings_in(lines: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lines:
        match = _SETTING.fullmatch(line.strip())
        assert match, f"{line!r}: write NAME='value' (compose takes a single-quoted value as written)"
        found[match[1]] = match[2]
    return found


def test_compose_gives_the_channels_file_to_human_interaction_only_and_it_ships_nothing_set() -> None:
    services = _compose()["services"]
    readers = {name for name, service in services.items() if REFERENCE in (service.get("env_file") or [])}
    assert readers == {"human-interaction"}
    text = CHANNELS_ENV.read_text(encoding="utf-8")
    live = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert live == [], "as shipped, no chat channel: every question reaches the web inbox"


def test_the_files_examples_are_the_settings_human_interaction_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    text = CHANNELS_ENV.read_text(encoding="utf-8")
    examples = [line.removeprefix("# ") for line in text.splitlines() if line.startswith("# TEMPORALITY_")]
    values = _settings_in(examples)
    assert set(values) == {
        "TEMPORALITY_HUMAN_TELEGRAM_TOKEN",
        "TEMPORALITY_HUMAN_MATRIX_HOMESERVER",
        "TEMPORALITY_HUMAN_MATRIX_USER_ID",
        "TEMPORALITY_HUMAN_MATRIX_PASSWORD",
        "TEMPORALITY_HUMAN_MATRIX_ACCESS_TOKEN",
    }
    for name in list(values):
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        if name != "TEMPORALITY_HUMAN_MATRIX_ACCESS_TOKEN":  # the password or the token: one is enough
            monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.telegram_enabled
    assert settings.telegram_token is not None
    assert settings.telegram_token.get_secret_value() == values["TEMPORALITY_HUMAN_TELEGRAM_TOKEN"]
    assert str(settings.matrix_homeserver).rstrip("/") == values["TEMPORALITY_HUMAN_MATRIX_HOMESERVER"]
    assert settings.matrix_user_id == values["TEMPORALITY_HUMAN_MATRIX_USER_ID"]
    check_channel_settings(settings)  # complete: no exit 2
