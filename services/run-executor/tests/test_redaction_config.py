"""The run-executor refuses to start with redaction patterns it could not apply (SEC-1): exit 2 at
configuration, rather than failing every question later."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from temporality_protocol.redaction import REDACT_PATTERNS_ENV, process_redactor
from temporality_run_executor.__main__ import configure
from temporality_run_executor.settings import Settings
from temporality_service import ConfigError

AGENTS = Path(__file__).resolve().parents[3] / "config" / "agents.yaml"


@pytest.fixture(autouse=True)
def _fresh_redactor() -> Iterator[None]:
    process_redactor.cache_clear()  # it reads the environment once per process
    yield
    process_redactor.cache_clear()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("{not json", "not JSON"),
        ('["ticket-\\\\d+"]', "JSON object"),
        ('{"ticket": "("}', "ticket"),
    ],
)
def test_unusable_patterns_stop_the_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    monkeypatch.setenv(REDACT_PATTERNS_ENV, value)
    with pytest.raises(ConfigError, match=REDACT_PATTERNS_ENV) as refused:
        configure(Settings(agents_file=AGENTS))
    assert says in str(refused.value)


def test_usable_patterns_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REDACT_PATTERNS_ENV, '{"ticket": "TCK-[0-9]{6}"}')
    configure(Settings(agents_file=AGENTS))
    # the redactor every question goes through (machine._park) has the configured pattern
    redacted = process_redactor().redact("see TCK-123456 for the keys")
    assert redacted.text == "see [REDACTED:ticket] for the keys"
    assert redacted.counts["ticket"] == 1
