"""Issue 11: the chart's embedded NATS speaks TLS (``nats.embedded.tls.existingSecret``) and fsyncs as
``nats.embedded.syncInterval`` says; the services get only the CA of its Secret.

Rendered with the Helm SDK as tests/test_deploy_files.py does (skipped without it), then run: the rendered
config, its certificate paths pointed at a CA and a certificate this test makes, starts a real nats-server that
refuses a plain connection and a client that does not trust the CA, and lets a service in with the
environment the chart gives it (``TEMPORALITY_NATS_TLS_CA_FILE``, its user and password) through the services'
own ``Bus.connect``. Three servers on the rendered 3-replica config form their cluster over TLS routes.
Mutual TLS (``nats.embedded.tls.mutual``, each client's own certificate) is in tests/test_chart_nats_mtls.py.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import ssl
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from e2e_support import eventually
from test_deploy_files import (
    NATS_NAME,
    NATS_PROBE_PATH,
    _deployments,
    _embedded,
    _kinds,
    _nats_conf,
    _nats_pod_env,
    _nats_secret,
    _ready,
    _render,
    _RenderedNats,
    _start_rendered_nats,
    _stop,
    _varz,
)

from temporality_bus import Bus, NatsSettings
from temporality_embedded import free_port
from temporality_protocol.catalog import EVENTS_STREAM
from temporality_protocol.permissions import service_inbox
from temporality_testing.tls import TestCA

TLS_SECRET = "nats-server-tls"
#: Where the rendered config reads the Secret's files (the StatefulSet mounts it there).
POD_FILES = {"tls.crt": "/etc/nats-tls/tls.crt", "tls.key": "/etc/nats-tls/tls.key", "ca.crt": "/etc/nats-tls/ca.crt"}


def _tls(replicas: int = 1, **embedded: Any) -> dict[str, Any]:
    return _embedded(replicas, nats={"embedded": {"tls": {"existingSecret": TLS_SECRET}, **embedded}})


def _server_cert(ca: TestCA, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1/localhost with both usages (a route presents its server certificate to its
    peer as a client), as the chart asks of the Secret's."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    cert_path, key_path = ca.directory / f"{name}.pem", ca.directory / f"{name}-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def _local(conf: str, ca: TestCA, cert: tuple[Path, Path]) -> str:
    """The rendered config with the Secret's files where this test keeps them."""
    local = {"tls.crt": cert[0], "tls.key": cert[1], "ca.crt": ca.ca_file}
    for key, path in POD_FILES.items():
        assert conf.count(f"{path}\n") >= 1, key
        conf = conf.replace(path, str(local[key]))
    return conf


def test_the_statefulset_mounts_the_secret_and_the_config_serves_tls_only_with_it() -> None:
    docs = _render(_tls(3, syncInterval="always"))
    sts = _kinds(docs)[("StatefulSet", NATS_NAME)]["spec"]["template"]["spec"]
    (container,) = sts["containers"]
    assert {"name": "tls", "mountPath": "/etc/nats-tls", "readOnly": True} in container["volumeMounts"]
    volume = next(v for v in sts["volumes"] if v["name"] == "tls")
    assert volume["secret"] == {"secretName": TLS_SECRET, "defaultMode": 0o400}
    conf = _nats_conf(docs)
    # the clients' block and the routes' block, both with the Secret's files
    assert conf.count("cert_file: /etc/nats-tls/tls.crt") == 2
    assert conf.count("ca_file: /etc/nats-tls/ca.crt") == 2
    # no `verify` / `verify_and_map` key in a tls block (subjects elsewhere may contain the word)
    assert not re.search(r"^\s*verify(_and_map)?\s*:", conf, re.MULTILINE), (
        "the services log in with their passwords: no client certificate asked"
    )
    assert 'sync_interval: "always"' in conf
    # every service: the CA only (never the server's key), and the variable its NatsSettings read
    for name, deployment in _deployments(_tls(3)).items():
        pod = deployment["spec"]["template"]["spec"]
        (service,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in service["env"]}
        assert env["TEMPORALITY_NATS_TLS_CA_FILE"] == "/etc/temporality/nats-tls/ca.crt", name
        assert "TEMPORALITY_NATS_TLS_CERT_FILE" not in env, name
        assert env["TEMPORALITY_NATS_URL"] == f"nats://{NATS_NAME}:4222"
        volume = next(v for v in pod["volumes"] if v["name"] == "nats-tls")
        assert volume["secret"] == {
            "secretName": TLS_SECRET,
            "defaultMode": 0o400,
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        }, name
        assert {"name": "nats-tls", "mountPath": "/etc/temporality/nats-tls", "readOnly": True} in service[
            "volumeMounts"
        ]


def test_without_the_secret_the_embedded_nats_is_plain_and_fsyncs_by_its_default() -> None:
    docs = _render(_embedded(1))
    conf = _nats_conf(docs)
    assert "tls {" not in conf
    assert "sync_interval" not in conf
    (container,) = _kinds(docs)[("StatefulSet", NATS_NAME)]["spec"]["template"]["spec"]["containers"]
    assert "tls" not in {m["name"] for m in container["volumeMounts"]}
    for name, deployment in _deployments(_embedded(1)).items():
        env = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert "TEMPORALITY_NATS_TLS_CA_FILE" not in env, name
    # the embedded server's TLS Secret means nothing for an external NATS (nats.tls is for that one)
    external = _deployments({"nats": {"embedded": {"tls": {"existingSecret": TLS_SECRET}}}})
    for name, deployment in external.items():
        env = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert "TEMPORALITY_NATS_TLS_CA_FILE" not in env, name


@pytest.mark.parametrize("value", ["sometimes", "10", "1d"])
def test_a_sync_interval_nats_cannot_read_fails_the_render(value: str) -> None:
    with pytest.raises(Exception, match="syncInterval"):
        _render(_tls(1, syncInterval=value))


@pytest.mark.parametrize(("interval", "expected"), [("always", "always"), ("2m", 120 * 10**9)])
async def test_the_rendered_tls_config_admits_a_service_with_the_ca_and_refuses_the_rest(
    tmp_path: Path, interval: str, expected: object
) -> None:
    ca = TestCA.create(tmp_path / "pki")
    cert = _server_cert(ca, "nats")
    docs = _render(_tls(1, syncInterval=interval))
    secret = _nats_secret()
    env = {**os.environ, **_nats_pod_env(docs, f"{NATS_NAME}-0", secret)}
    server = _start_rendered_nats(_local(_nats_conf(docs), ca, cert), tmp_path / "nats", env)
    try:
        await _ready(server, tmp_path / "nats")
        async with httpx.AsyncClient(timeout=5) as client:  # the probes' port stays plain HTTP
            assert (await client.get(server.monitoring + NATS_PROBE_PATH)).status_code == 200
        varz = await _varz(server.monitoring)
        assert varz["tls_required"] is True
        # the value reaches the server as written: a bare 2m in a nats config is read as 2,000,000 s
        config = varz["jetstream"]["config"]
        if expected == "always":
            assert config["sync_always"] is True
        else:
            assert not config.get("sync_always")
            assert config["sync_interval"] == expected

        # the journal, with what the chart gives it: its user, its password, the CA
        journal = NatsSettings(
            url=server.url,
            user="journal",
            password=secret["journal-password"],
            tls_ca_file=ca.ca_file,
            connect_timeout_s=5,
            max_reconnect_attempts=0,
        )
        async with Bus.connect(journal, name="journal", inbox_prefix=service_inbox("journal")) as bus:
            await bus.ensure([EVENTS_STREAM])
            assert (await bus.js.stream_info(EVENTS_STREAM.name)).config.name == EVENTS_STREAM.name

        # a client that does not trust the CA (its own, or the system's: nats-py upgrades to TLS as the server
        # asks, never falls back to plain TCP) is refused
        stranger = TestCA.create(tmp_path / "stranger", name="another CA")
        for context in (NatsSettings(url=server.url, tls_ca_file=stranger.ca_file).ssl_context(), None):
            with pytest.raises(ssl.SSLCertVerificationError):
                await nats.connect(server.url, tls=context, allow_reconnect=False, connect_timeout=3)
    finally:
        _stop(server)


async def test_three_rendered_servers_form_their_cluster_over_tls_routes(tmp_path: Path) -> None:
    ca = TestCA.create(tmp_path / "pki")
    cert = _server_cert(ca, "nats")
    docs = _render(_tls(3))
    conf = _local(_nats_conf(docs), ca, cert)
    pods = [f"{NATS_NAME}-{i}" for i in range(3)]
    secret = _nats_secret()
    route_ports = [free_port() for _ in pods]
    routes = ",".join(f"nats://127.0.0.1:{port}" for port in route_ports)
    servers: list[_RenderedNats] = []
    try:
        for pod, port in zip(pods, route_ports, strict=True):
            env = {**os.environ, **_nats_pod_env(docs, pod, secret)}
            args = ("--cluster", f"nats://127.0.0.1:{port}", "--routes", routes)
            servers.append(_start_rendered_nats(conf, tmp_path / pod, env, *args))
        for pod, server in zip(pods, servers, strict=True):
            await _ready(server, tmp_path / pod)

        async def routed() -> bool:
            counts = []
            async with httpx.AsyncClient(timeout=5) as client:
                for server in servers:
                    routez = (await client.get(server.monitoring + "/routez")).json()
                    counts.append(len({r.get("remote_name") or r.get("remote_id") for r in routez.get("routes", [])}))
            return all(count == 2 for count in counts)

        await eventually(routed, timeout_s=30, what="every server routed to its two peers over TLS")
        for server in servers:
            cluster = (await _varz(server.monitoring))["cluster"]
            assert cluster["tls_required"] is True, cluster
            assert cluster["tls_verify"] is True, cluster  # each route's certificate checked against the CA
    finally:
        for server in servers:
            _stop(server)
