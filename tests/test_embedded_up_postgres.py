"""``temporality up`` on PostgreSQL: ``--database-url`` (by default the environment's ``TEMPORALITY_DATABASE_URL``)
is the journal's database -- its tables are made there, the data dir gets no SQLite file -- and the banner names
it without its password. A database URL the journal cannot use stops ``up`` before anything starts."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import asyncpg
import httpx
import pytest
from e2e_support import CONFIG
from sqlalchemy.engine import make_url
from test_embedded_supervision import Up
from test_embedded_up import SCRIPT

from temporality_embedded.cli import build_parser, database_url
from temporality_journal.database import head_revision
from temporality_testing.postgres import fresh_postgres_database

pytestmark = pytest.mark.e2e

#: trust authentication ignores it: it is there to be kept out of the banner
PASSWORD = "f2-s3cret-pw"


async def _tables(url: str) -> tuple[set[str], str | None]:
    """The tables of the database ``url`` and its journal schema revision."""
    conn = await asyncpg.connect(url, timeout=5)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = {str(row["tablename"]) for row in rows}
        version = None
        if "journal_schema_version" in tables:
            version = await conn.fetchval("SELECT version_num FROM journal_schema_version")
        return tables, version
    finally:
        await conn.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("given", ["environment", "option"])
async def test_up_runs_the_journal_on_the_postgresql_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    async with fresh_postgres_database("f2_up") as url:
        plain = make_url(url).set(drivername="postgresql")
        with_password = plain.set(password=PASSWORD).render_as_string(hide_password=False)
        extra: tuple[str, ...] = ()
        if given == "environment":
            monkeypatch.setenv("TEMPORALITY_DATABASE_URL", with_password)
        else:  # the option wins over the environment's
            monkeypatch.setenv("TEMPORALITY_DATABASE_URL", "sqlite:////nonexistent/never-used.db")
            extra = ("--database-url", with_password)
        data_dir = tmp_path / "data"
        up = Up(data_dir, CONFIG, *extra)
        try:
            out = await asyncio.to_thread(up.ready)
            async with httpx.AsyncClient(trust_env=False) as client:
                answer = await client.get(
                    f"http://127.0.0.1:{up.ports['journal']}/runs",
                    headers={"Authorization": f"Bearer {up.token()}"},
                    timeout=10,
                )
            assert answer.status_code == 200, answer.text  # the journal serves from PostgreSQL
            tables, version = await _tables(plain.render_as_string(hide_password=False))
        finally:
            assert await asyncio.to_thread(up.interrupt) == 0, up.output
        assert PASSWORD not in up.output
        assert "Starting Temporality: nats-server (JetStream) + PostgreSQL + 5 services ..." in out
        (line,) = [line for line in out.splitlines() if line.startswith("  Journal database ")]
        source = "--database-url" if given == "option" else "TEMPORALITY_DATABASE_URL of the environment"
        shown = f"postgresql://{plain.username}:***@{plain.host}:{plain.port}/{plain.database}"
        assert line == f"  Journal database           {shown}   ({source})", line
        assert not any("Journal SQLite fsync" in line for line in out.splitlines())
        assert {"events", "runs", "journal_schema_version"} <= tables, tables
        assert version == head_revision()
        assert not list(data_dir.glob("journal.db*")), sorted(p.name for p in data_dir.iterdir())


def test_the_database_url_option_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    monkeypatch.delenv("TEMPORALITY_DATABASE_URL", raising=False)
    assert database_url(parser.parse_args(["up"])) is None  # SQLite in the data dir
    monkeypatch.setenv("TEMPORALITY_DATABASE_URL", "")
    assert database_url(parser.parse_args(["up"])) is None  # empty is unset
    monkeypatch.setenv("TEMPORALITY_DATABASE_URL", "postgresql://a@h/env")
    assert database_url(parser.parse_args(["up"])) == "postgresql://a@h/env"
    assert database_url(parser.parse_args(["up", "--database-url", "postgresql://a@h/opt"])) == "postgresql://a@h/opt"


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (
            ("--database-url", "mysql://root:hunter2@db/j"),
            "error: the journal's database must be SQLite or PostgreSQL (sqlite:///path, "
            "postgresql://user:password@host/db), not mysql://root:***@db/j (--database-url)",
        ),
        (
            ("--database-url", "postgresql://u@127.0.0.1/j", "--sqlite-synchronous", "full"),
            "error: --sqlite-synchronous applies to the journal on SQLite only; this one is on PostgreSQL",
        ),
    ],
)
def test_up_refuses_a_database_the_journal_cannot_use(tmp_path: Path, extra: tuple[str, ...], said: str) -> None:
    result = subprocess.run(
        [str(SCRIPT), "up", "--data-dir", str(tmp_path / "d"), "--config-dir", str(CONFIG), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stdout
    assert said in result.stdout.splitlines(), result.stdout
    assert "hunter2" not in result.stdout
    assert "Starting Temporality" not in result.stdout
