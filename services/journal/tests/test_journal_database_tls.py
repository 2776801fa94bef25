"""TLS to PostgreSQL: libpq's ``sslmode``/``sslrootcert``/``sslcert``/``sslkey`` from the URL or the settings become
asyncpg's ``ssl``; against a real PostgreSQL the test starts with a certificate from a CA it makes (skipped
where ``initdb`` cannot run)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from temporality_journal import Database, Settings
from temporality_journal.database import DatabaseTls, connect_args
from temporality_testing.tls import TestCA

PG_URL = "postgresql+asyncpg://journal@db.example:5432/journal"


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA.create(tmp_path / "ca")


# --------------------------------------------------------------------------- settings and connection arguments
def test_the_settings_read_the_tls_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TEMPORALITY_DATABASE_SSLMODE", "verify-full")
    monkeypatch.setenv("TEMPORALITY_DATABASE_SSLROOTCERT", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("TEMPORALITY_DATABASE_SSLCERT", str(tmp_path / "client.pem"))
    monkeypatch.setenv("TEMPORALITY_DATABASE_SSLKEY", str(tmp_path / "client-key.pem"))
    assert Settings().database_tls() == DatabaseTls(
        "verify-full", tmp_path / "ca.pem", tmp_path / "client.pem", tmp_path / "client-key.pem"
    )
    for name in ("SSLMODE", "SSLROOTCERT", "SSLCERT", "SSLKEY"):  # empty (a chart's unset value): not given
        monkeypatch.setenv(f"TEMPORALITY_DATABASE_{name}", "")
    assert Settings().database_tls() == DatabaseTls()
    monkeypatch.setenv("TEMPORALITY_DATABASE_SSLMODE", "verify_full")
    with pytest.raises(ValidationError, match="TEMPORALITY_DATABASE_SSLMODE"):
        Settings()


@pytest.mark.parametrize("mode", ["disable", "allow", "prefer", "require"])
def test_modes_that_verify_nothing_are_asyncpg_s_own(mode: str) -> None:
    url, args = connect_args(f"{PG_URL}?sslmode={mode}&application_name=journal")
    assert args == {"ssl": mode}
    assert dict(url.query) == {"application_name": "journal"}  # libpq's parameters are taken out, others kept


def test_no_tls_parameter_leaves_asyncpg_s_default() -> None:
    url, args = connect_args("postgresql://journal@db.example/journal")
    assert args == {}
    assert url.drivername == "postgresql+asyncpg"


def test_verify_full_checks_the_chain_and_the_host(ca: TestCA) -> None:
    url, args = connect_args(f"{PG_URL}?sslmode=verify-full&sslrootcert={ca.ca_file}")
    context = args["ssl"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "Temporality test CA"),),)]
    assert not url.query


@pytest.mark.parametrize("mode", ["verify-ca", "require"])
def test_verify_ca_and_require_with_a_root_certificate_check_the_chain_only(ca: TestCA, mode: str) -> None:
    _, args = connect_args(PG_URL, DatabaseTls(sslmode=mode, sslrootcert=ca.ca_file))  # type: ignore[arg-type]
    context = args["ssl"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert not context.check_hostname


def test_the_settings_win_over_the_url(ca: TestCA) -> None:
    _, args = connect_args(f"{PG_URL}?sslmode=disable&sslrootcert={ca.ca_file}", DatabaseTls(sslmode="verify-full"))
    assert isinstance(args["ssl"], ssl.SSLContext)
    assert args["ssl"].check_hostname  # verify-full from the settings, the CA from the URL
    _, args = connect_args(f"{PG_URL}?sslmode=verify-full", DatabaseTls(sslmode="disable"))
    assert args == {"ssl": "disable"}


def test_a_client_certificate_is_loaded(ca: TestCA) -> None:
    cert, key = ca.issue("journal-client", server=False)
    _, args = connect_args(PG_URL, DatabaseTls(sslmode="verify-full", sslrootcert=ca.ca_file, sslcert=cert, sslkey=key))
    assert isinstance(args["ssl"], ssl.SSLContext)
    _, args = connect_args(PG_URL, DatabaseTls(sslmode="require", sslcert=cert, sslkey=key))
    assert isinstance(args["ssl"], ssl.SSLContext)
    assert args["ssl"].verify_mode is ssl.CERT_NONE  # require: encrypted, the server unchecked (libpq's meaning)


@pytest.mark.parametrize(
    ("url", "tls", "error"),
    [
        (f"{PG_URL}?sslmode=verify_full", None, "sslmode 'verify_full' is not one of"),
        (PG_URL, DatabaseTls(sslmode="verify-full", sslrootcert=Path("/nonexistent/ca.pem")), "cannot use"),
        (PG_URL, DatabaseTls(sslmode="require", sslcert=Path("/x/client.pem")), "sslcert and sslkey go together"),
        ("sqlite+aiosqlite:///journal.db?sslmode=require", None, "PostgreSQL only"),
        ("sqlite+aiosqlite:///journal.db", DatabaseTls(sslmode="require"), "PostgreSQL only"),
        (f"{PG_URL}?sslmode=require&sslmode=disable", None, "more than once"),
    ],
    ids=["bad-mode", "missing-ca", "cert-without-key", "sqlite-url", "sqlite-settings", "twice"],
)
def test_bad_tls_settings_are_refused(url: str, tls: DatabaseTls | None, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        connect_args(url, tls)


async def test_the_journal_refuses_unusable_tls_settings_at_start_exit_2(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TEMPORALITY_NATS_URL": "nats://127.0.0.1:1",  # never reached: configure() refuses first
        "TEMPORALITY_DATABASE_URL": "postgresql://journal@127.0.0.1:1/journal",
        "TEMPORALITY_DATABASE_SSLMODE": "verify-full",
        "TEMPORALITY_DATABASE_SSLROOTCERT": str(tmp_path / "missing-ca.pem"),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "temporality_journal",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, out
    assert b"config.invalid" in out
    assert b"TEMPORALITY_DATABASE_SSL" in out


# --------------------------------------------------------------------------- a real PostgreSQL that requires TLS
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def tls_postgres(tmp_path: Path, ca: TestCA) -> AsyncIterator[str]:
    """A PostgreSQL of its own on a random port, accepting TLS connections only (``hostssl``), with a server
    certificate for 127.0.0.1 from ``ca``; yields its URL (no TLS parameters). Runs as ``postgres`` under root."""
    initdb, postgres, isready = shutil.which("initdb"), shutil.which("postgres"), shutil.which("pg_isready")
    if initdb is None or postgres is None or isready is None:
        pytest.skip("no initdb/postgres/pg_isready binaries here")
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: initdb cannot run")
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root without a postgres user: initdb cannot run")
        as_user = ["runuser", "-u", "postgres", "--"]
    # not under tmp_path: pytest's base directory is private to root, and postgres must reach its files
    base = Path(tempfile.mkdtemp(prefix="temporality-pgtls-"))
    issued = ca.issue("postgres-server")
    cert, key = base / "server.pem", base / "server-key.pem"
    shutil.copyfile(issued[0], cert)
    shutil.copyfile(issued[1], key)
    key.chmod(0o600)
    if as_user:
        for path in (base, cert, key):
            shutil.chown(path, "postgres")
    data = base / "data"
    done = await asyncio.to_thread(
        subprocess.run,
        [*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"initdb failed here: {done.stderr.decode()[-300:]}")
    (data / "pg_hba.conf").write_text(
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n"
    )
    port = _free_port()
    server = await asyncio.create_subprocess_exec(
        *as_user,
        postgres,
        "-D", str(data),
        "-p", str(port),
        "-c", "listen_addresses=127.0.0.1",
        "-c", f"unix_socket_directories={base}",
        "-c", "ssl=on",
        "-c", f"ssl_cert_file={cert}",
        "-c", f"ssl_key_file={key}",
        "-c", "fsync=off",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    # Ready when pg_isready says it accepts connections: the port opens while the server still answers
    # "the database system is starting up" (a TCP connect alone let the test in too early under load).
    ready_cmd = [isready, "-q", "-h", "127.0.0.1", "-p", str(port)]
    try:
        async with asyncio.timeout(60):
            while True:
                assert server.returncode is None, "postgres exited at start"
                probe = await asyncio.create_subprocess_exec(*ready_cmd)
                if await probe.wait() == 0:
                    break
                await asyncio.sleep(0.1)
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 30)
        shutil.rmtree(base, ignore_errors=True)


async def _encrypted(database: Database) -> bool:
    async with database.engine.connect() as conn:
        return bool((await conn.execute(text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"))).scalar())


async def test_the_journal_reaches_a_postgresql_that_requires_tls(
    tls_postgres: str, ca: TestCA, tmp_path: Path
) -> None:
    async with Database.open(f"{tls_postgres}?sslmode=verify-full&sslrootcert={ca.ca_file}") as database:
        assert await _encrypted(database)  # and the schema was migrated over it
        assert await database.revision() is not None
    async with Database.open(tls_postgres, DatabaseTls(sslmode="require")) as database:
        assert await _encrypted(database)
    with pytest.raises(
        Exception, match=r"pg_hba\.conf rejects connection .*no encryption"
    ):  # the server refuses plain connections
        async with Database.open(tls_postgres, DatabaseTls(sslmode="disable")):
            pass
    stranger = TestCA.create(tmp_path / "other-ca", name="Another CA")
    with pytest.raises(ssl.SSLCertVerificationError):  # a server certificate from another CA: refused
        async with Database.open(tls_postgres, DatabaseTls(sslmode="verify-ca", sslrootcert=stranger.ca_file)):
            pass
