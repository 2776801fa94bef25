"""The commit modes the journal's settings choose (issue 11), as every connection it opens reports them: a real
SQLite file (``PRAGMA synchronous``) and a real PostgreSQL (``SHOW synchronous_commit``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from journal_support import serve_journal, served_settings
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from temporality_bus import Bus, NatsSettings
from temporality_embedded.cli import build_parser, stack_config
from temporality_embedded.stack import Stack
from temporality_journal import Database, Settings

#: ``PRAGMA synchronous`` answers a number
_SQLITE_LEVEL = {"off": 0, "normal": 1, "full": 2}


def _settings(monkeypatch: pytest.MonkeyPatch, url: str, **env: str) -> Settings:
    monkeypatch.setenv("TEMPORALITY_DATABASE_URL", url)
    for name in ("SQLITE_SYNCHRONOUS", "POSTGRES_SYNCHRONOUS_COMMIT"):
        monkeypatch.delenv(f"TEMPORALITY_JOURNAL_{name}", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(f"TEMPORALITY_JOURNAL_{name}", value)
    return Settings()


async def _mode(conn: AsyncConnection, dialect: str) -> str:
    if dialect == "sqlite":
        level = int((await conn.execute(text("PRAGMA synchronous"))).scalar_one())
        return {v: k for k, v in _SQLITE_LEVEL.items()}[level]
    return str((await conn.execute(text("SHOW synchronous_commit"))).scalar_one())


async def _modes_of_two_connections(settings: Settings) -> tuple[str, list[str]]:
    """The mode each of two connections open at once reports (the pool's first and a second one)."""
    async with Database.open(settings.database_url, settings.database_tls(), settings.database_durability()) as db:
        async with db.engine.connect() as first, db.engine.connect() as second:
            return db.dialect, list(await asyncio.gather(_mode(first, db.dialect), _mode(second, db.dialect)))


@pytest.mark.parametrize(
    ("env", "sqlite", "postgres"),
    [
        ({}, "normal", None),  # today's behaviour: NORMAL, the server's synchronous_commit
        ({"SQLITE_SYNCHRONOUS": "", "POSTGRES_SYNCHRONOUS_COMMIT": ""}, "normal", None),  # compose's empty defaults
        ({"SQLITE_SYNCHRONOUS": "full", "POSTGRES_SYNCHRONOUS_COMMIT": "off"}, "full", "off"),
        ({"SQLITE_SYNCHRONOUS": "FULL", "POSTGRES_SYNCHRONOUS_COMMIT": "remote_apply"}, "full", "remote_apply"),
        ({"SQLITE_SYNCHRONOUS": "normal", "POSTGRES_SYNCHRONOUS_COMMIT": "local"}, "normal", "local"),
    ],
)
async def test_every_connection_runs_with_the_chosen_mode(
    monkeypatch: pytest.MonkeyPatch, database_url: str, env: dict[str, str], sqlite: str, postgres: str | None
) -> None:
    settings = _settings(monkeypatch, database_url, **env)
    dialect, modes = await _modes_of_two_connections(settings)
    if dialect == "sqlite":
        assert modes == [sqlite, sqlite]
        return
    if postgres is None:  # not set by the journal: the server's own, whatever it is
        async with Database.open(database_url) as db, db.engine.connect() as conn:
            source = (
                await conn.execute(text("SELECT source FROM pg_settings WHERE name = 'synchronous_commit'"))
            ).scalar_one()
        assert source != "client", "the journal set synchronous_commit though none was chosen"
        return
    assert modes == [postgres, postgres]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SQLITE_SYNCHRONOUS", "off"),  # refused: a power cut may corrupt the file
        ("SQLITE_SYNCHRONOUS", "extra"),
        ("POSTGRES_SYNCHRONOUS_COMMIT", "maybe"),
    ],
)
def test_a_mode_not_offered_is_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    with pytest.raises(ValidationError, match=name.lower()):
        _settings(monkeypatch, "sqlite+aiosqlite:///journal.db", **{name: value})


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ([], "normal"),
        (["--sync-always"], "full"),  # fsync on every write: the bus and the journal's commits
        (["--sqlite-synchronous", "full"], "full"),
        (["--sync-always", "--sqlite-synchronous", "normal"], "normal"),  # the explicit choice wins
    ],
)
async def test_temporality_up_chooses_the_journal_mode(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, arguments: list[str], expected: str
) -> None:
    """``temporality up``'s options, through the journal's environment the stack gives it, to what its SQLite
    connections report."""
    args = build_parser().parse_args(["up", "--data-dir", str(tmp_path), *arguments])
    env = Stack(stack_config(args)).env_for("journal")
    assert ("TEMPORALITY_JOURNAL_SQLITE_SYNCHRONOUS" in env) == bool(arguments)
    settings = _settings(
        monkeypatch,
        env["TEMPORALITY_DATABASE_URL"],
        **{k.removeprefix("TEMPORALITY_JOURNAL_"): v for k, v in env.items() if k.endswith("_SYNCHRONOUS")},
    )
    assert await _modes_of_two_connections(settings) == ("sqlite", [expected, expected])


async def test_the_served_journal_opens_its_database_with_the_chosen_mode(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str
) -> None:
    """The journal as the service runs it (``configure``/``setup``) hands its settings' modes to its database:
    the connections its API and recorder use report them."""
    settings = served_settings(tmp_path, nats_settings, database_url).model_copy(
        update={"sqlite_synchronous": "full", "postgres_synchronous_commit": "off"}
    )
    async with serve_journal(settings, bus) as served:
        assert served.runtime.app is not None
        database: Database = served.runtime.app.state.database
        async with database.engine.connect() as first, database.engine.connect() as second:
            modes = [await _mode(first, database.dialect), await _mode(second, database.dialect)]
    assert modes == (["full", "full"] if database.dialect == "sqlite" else ["off", "off"])
