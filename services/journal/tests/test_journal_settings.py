"""Settings from the environment, database URLs, and the SQLite file's parent directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from temporality_journal import DEFAULT_DATABASE_URL, Database, Settings, async_url


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TEMPORALITY_DATABASE_URL", "TEMPORALITY_JOURNAL_HOST", "TEMPORALITY_JOURNAL_PORT"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert (settings.host, settings.port, settings.database_url) == ("127.0.0.1", 8082, DEFAULT_DATABASE_URL)


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORALITY_DATABASE_URL", "postgresql+asyncpg://journal@db:5432/journal")
    monkeypatch.setenv("TEMPORALITY_JOURNAL_HOST", "0.0.0.0")
    monkeypatch.setenv("TEMPORALITY_JOURNAL_PORT", "9000")
    monkeypatch.setenv("TEMPORALITY_NATS_URL", "nats://nats:4222")
    monkeypatch.setenv("TEMPORALITY_READY_FILE", "/tmp/journal.ready")
    settings = Settings()
    assert settings.database_url == "postgresql+asyncpg://journal@db:5432/journal"
    assert (settings.host, settings.port) == ("0.0.0.0", 9000)
    assert settings.nats.servers == ["nats://nats:4222"]
    assert settings.process.ready_file == Path("/tmp/journal.ready")
    assert Settings(database_url="sqlite:///x.db").database_url == "sqlite:///x.db"


def test_batch_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEMPORALITY_JOURNAL_BATCH_SIZE", raising=False)
    assert Settings().batch_size == 1000
    monkeypatch.setenv("TEMPORALITY_JOURNAL_BATCH_SIZE", "32")
    assert Settings().batch_size == 32
    monkeypatch.setenv("TEMPORALITY_JOURNAL_BATCH_SIZE", "0")
    with pytest.raises(ValidationError):
        Settings()
    # more than the journal ever asks for: refused at start (the consumer bounds it to half max_ack_pending anyway)
    monkeypatch.setenv("TEMPORALITY_JOURNAL_BATCH_SIZE", "1001")
    with pytest.raises(ValidationError):
        Settings()


def test_batch_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEMPORALITY_JOURNAL_BATCH_LINGER_MS", raising=False)
    assert Settings().batch_linger_ms == 20
    monkeypatch.setenv("TEMPORALITY_JOURNAL_BATCH_LINGER_MS", "0")
    assert Settings().batch_linger_ms == 0
    monkeypatch.setenv("TEMPORALITY_JOURNAL_BATCH_LINGER_MS", "-1")
    with pytest.raises(ValidationError):
        Settings()


def test_bad_environment_fails_early(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORALITY_JOURNAL_PORT", "70000")
    with pytest.raises(ValidationError):
        Settings()


@pytest.mark.parametrize(
    ("given", "driver"),
    [
        ("sqlite:///a/b.db", "sqlite+aiosqlite"),
        ("sqlite+aiosqlite:///a/b.db", "sqlite+aiosqlite"),
        ("postgresql://u@h/db", "postgresql+asyncpg"),
        ("postgres://u@h/db", "postgresql+asyncpg"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg"),
    ],
)
def test_async_url_picks_the_async_driver(given: str, driver: str) -> None:
    assert async_url(given).drivername == driver


def test_async_url_refuses_other_databases() -> None:
    with pytest.raises(ValueError, match="unsupported database"):
        async_url("mysql://u@h/db")


async def test_sqlite_parent_directory_is_created(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "journal.db"
    async with Database.open(f"sqlite:///{path}") as database:
        await database.ping()
        assert database.dialect == "sqlite"
    assert path.exists()
    async with Database.open(f"sqlite:///{path}"):  # opening again finds the tables
        pass
