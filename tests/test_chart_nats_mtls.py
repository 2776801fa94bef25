"""Mutual TLS to NATS in the chart: the embedded NATS requires a client certificate (``nats.embedded.tls.mutual``:
``verify: true``, as compose's nats-mtls.conf) and each NATS client presents its own, mounted from
``nats.tls.clientCertSecrets.<client>``; an external NATS's mutual TLS still falls back to the one shared
``tls.crt``/``tls.key`` of ``nats.tls.existingSecret`` (the values of existing installs).

Rendered with the Helm SDK as tests/test_deploy_files.py does, checked against the Kubernetes API's schemas, then
run: the rendered config, its certificate paths pointed at a CA and certificates this test makes, starts a real
nats-server, and every client connects with exactly the files its rendered pod would see (its volume's Secrets,
projected as the kubelet would, mapped to this test's files) and its user and password. A client without a
certificate, with one from another CA, or with its own certificate but a wrong password is refused; the
certificate grants nothing beyond the user's permissions.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import yaml
from e2e_support import eventually
from pydantic import SecretStr
from test_chart_nats_tls import TLS_SECRET, _local, _server_cert
from test_deploy_files import (
    CHART,
    NATS_NAME,
    NATS_SECRET,
    SERVICES,
    _embedded,
    _merge,
    _nats_conf,
    _nats_pod_env,
    _nats_secret,
    _ready,
    _render,
    _RenderedNats,
    _start_rendered_nats,
    _stop,
    _validate,
    _varz,
)

from temporality_bus import Bus, NatsSettings
from temporality_protocol.catalog import EVENTS_STREAM
from temporality_protocol.permissions import TIMERS_MIGRATION_USER, service_inbox
from temporality_testing.tls import TestCA

#: Every NATS client of the chart: the five services, the timers migration's Job and the operator's toolbox (its
#: pod ``tools``, the NATS user ``dlq-operator``; rendered with ``tools.enabled``).
CLIENTS = (*SERVICES, TIMERS_MIGRATION_USER, "tools")
#: One client-certificate Secret per client (as a cert-manager Certificate per service would make).
CLIENT_SECRETS = {name: f"nats-client-{name}" for name in CLIENTS}
MOUNT = "/etc/temporality/nats-tls"
TLS_ENV = {
    "TEMPORALITY_NATS_TLS_CA_FILE": f"{MOUNT}/ca.crt",
    "TEMPORALITY_NATS_TLS_CERT_FILE": f"{MOUNT}/tls.crt",
    "TEMPORALITY_NATS_TLS_KEY_FILE": f"{MOUNT}/tls.key",
}
#: The old single Secret of an external NATS's mutual TLS (ca.crt, tls.crt, tls.key).
SHARED = "nats-client"

#: The keys a client mounts of the shared Secret of an external NATS (mutual TLS): never another one of it.
SHARED_KEYS = [
    {"key": "ca.crt", "path": "ca.crt"},
    {"key": "tls.crt", "path": "tls.crt"},
    {"key": "tls.key", "path": "tls.key"},
]


def _mtls(replicas: int = 1, **extra: Any) -> dict[str, Any]:
    """The embedded NATS with mutual TLS and every client's own Secret."""
    values = _embedded(
        replicas,
        nats={
            "embedded": {"tls": {"existingSecret": TLS_SECRET, "mutual": True}},
            "tls": {"clientCertSecrets": CLIENT_SECRETS},
        },
        tools={"enabled": True},
    )
    return _merge(values, extra)


def _external(**tls: Any) -> dict[str, Any]:
    return {
        "nats": {
            "url": "nats://nats.example:4222",
            "auth": {"existingSecret": NATS_SECRET},
            "tls": {"existingSecret": SHARED, "mutual": True, **tls},
        },
        "tools": {"enabled": True},
    }


def _pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each NATS client's pod spec: the Deployments' by service, the timers migration Job's as timers-migrate."""
    pods = {
        d["metadata"]["name"].removeprefix("t-temporality-"): d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] == "Deployment"
    }
    for job in (d for d in docs if d["kind"] == "Job"):
        pods["timers-migrate"] = job["spec"]["template"]["spec"]
    return pods


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _nats_tls_volume(pod: dict[str, Any]) -> dict[str, Any]:
    (volume,) = [v for v in pod["volumes"] if v["name"] == "nats-tls"]
    return volume


def _volume_secrets(volume: dict[str, Any]) -> list[tuple[str, list[dict[str, str]] | None]]:
    """The Secrets a nats-tls volume shows, each with its items (None: every key)."""
    if "projected" in volume:
        return [(s["secret"]["name"], s["secret"].get("items")) for s in volume["projected"]["sources"]]
    return [(volume["secret"]["secretName"], volume["secret"].get("items"))]


def _pod_files(pod: dict[str, Any], secrets: dict[str, dict[str, Path]]) -> dict[str, Path]:
    """What the kubelet puts under the pod's nats-tls mount, as {path in the pod: this test's file}: ``secrets``
    are the Secrets' keys as this test keeps them."""
    (container,) = pod["containers"]
    (mount,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "nats-tls"]
    files: dict[str, Path] = {}
    for name, items in _volume_secrets(_nats_tls_volume(pod)):
        data = secrets[name]
        for item in items if items is not None else [{"key": key, "path": key} for key in data]:
            path = f"{mount}/{item['path']}"
            assert path not in files, f"{path} projected twice"
            files[path] = data[item["key"]]
    return files


def _settings(
    pod: dict[str, Any], url: str, passwords: dict[str, str], secrets: dict[str, dict[str, Path]]
) -> NatsSettings:
    """The NatsSettings a pod's environment gives its process, its files mapped to this test's."""
    env, files = _env(pod), _pod_files(pod, secrets)
    password = env["TEMPORALITY_NATS_PASSWORD"]["secretKeyRef"]
    assert password["name"] == NATS_SECRET
    return NatsSettings(
        url=url,
        user=env["TEMPORALITY_NATS_USER"],
        password=passwords[password["key"]],
        tls_ca_file=files[env["TEMPORALITY_NATS_TLS_CA_FILE"]],
        tls_cert_file=files[env["TEMPORALITY_NATS_TLS_CERT_FILE"]],
        tls_key_file=files[env["TEMPORALITY_NATS_TLS_KEY_FILE"]],
        connect_timeout_s=5,
        max_reconnect_attempts=0,
    )


# --------------------------------------------------------------------------- rendering


def test_the_embedded_mutual_tls_requires_client_certificates_and_mounts_each_client_its_own() -> None:
    docs = _render(_mtls(3))
    conf = _nats_conf(docs)
    client_block = re.search(r"^tls \{\n(.*?)^\}", conf, re.M | re.S)
    assert client_block is not None, conf
    assert re.search(r"^\s*verify: true$", client_block[1], re.M), client_block[1]
    assert "ca_file: /etc/nats-tls/ca.crt" in client_block[1]
    # `verify`, not `verify_and_map`: the users and permissions stay those of the passwords, as in compose
    assert not re.search(r"^\s*verify_and_map\s*:", conf, re.M)
    assert len(re.findall(r"^\s*verify:", conf, re.M)) == 1, "only the clients' block (routes always verify)"
    pods = _pods(docs)
    assert set(pods) == set(CLIENTS)
    for name, pod in pods.items():
        env = _env(pod)
        assert {k: v for k, v in env.items() if k.startswith("TEMPORALITY_NATS_TLS_")} == TLS_ENV, name
        volume = _nats_tls_volume(pod)
        assert volume == {
            "name": "nats-tls",
            "projected": {
                "defaultMode": 0o400,
                "sources": [
                    # the server's Secret: its CA only, never the server's key
                    {"secret": {"name": TLS_SECRET, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    # its own certificate and key, nothing else of that Secret (a cert-manager one has ca.crt too)
                    {
                        "secret": {
                            "name": CLIENT_SECRETS[name],
                            "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
                        }
                    },
                ],
            },
        }, name
        # no other client's Secret anywhere in its pod
        others = {secret for client, secret in CLIENT_SECRETS.items() if client != name}
        assert not [s for s in others if s in str(pod)], name
        (container,) = pod["containers"]
        assert {"name": "nats-tls", "mountPath": MOUNT, "readOnly": True} in container["volumeMounts"], name


def test_without_mutual_the_embedded_tls_renders_as_before() -> None:
    docs = _render(_embedded(1, nats={"embedded": {"tls": {"existingSecret": TLS_SECRET}}}))
    assert not re.search(r"^\s*verify(_and_map)?\s*:", _nats_conf(docs), re.M)
    for name, pod in _pods(docs).items():
        assert "TEMPORALITY_NATS_TLS_CERT_FILE" not in _env(pod), name
        assert _nats_tls_volume(pod) == {
            "name": "nats-tls",
            "secret": {"secretName": TLS_SECRET, "defaultMode": 0o400, "items": [{"key": "ca.crt", "path": "ca.crt"}]},
        }, name


def test_the_old_single_secret_still_serves_every_client_of_an_external_nats() -> None:
    """Values from before per-client Secrets (nats.tls.existingSecret + mutual) render as they did: every client
    mounts the shared Secret's CA, certificate and key (only those three keys of it)."""
    pods = _pods(_render(_external()))
    assert set(pods) == set(CLIENTS)
    for name, pod in pods.items():
        assert {k: v for k, v in _env(pod).items() if k.startswith("TEMPORALITY_NATS_TLS_")} == TLS_ENV, name
        assert _nats_tls_volume(pod) == {
            "name": "nats-tls",
            "secret": {"secretName": SHARED, "defaultMode": 0o400, "items": SHARED_KEYS},
        }


def test_an_external_nats_s_clients_use_their_own_secret_where_given_and_the_shared_one_elsewhere() -> None:
    own = {"journal": "nats-journal", "timers-migrate": "nats-timers-migrate"}
    pods = _pods(_render(_external(clientCertSecrets=own)))
    for name, pod in pods.items():
        assert {k: v for k, v in _env(pod).items() if k.startswith("TEMPORALITY_NATS_TLS_")} == TLS_ENV, name
        secrets = _volume_secrets(_nats_tls_volume(pod))
        if name in own:
            assert secrets == [
                (SHARED, [{"key": "ca.crt", "path": "ca.crt"}]),
                (own[name], [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]),
            ], name
        else:
            assert secrets == [(SHARED, SHARED_KEYS)], name


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # a client without its certificate under the embedded mutual TLS: each one missing is named
        (
            _merge(_mtls(), {"nats": {"tls": {"clientCertSecrets": {"journal": "", "timers-migrate": ""}}}}),
            "nats.tls.clientCertSecrets.<client> (a Secret with tls.crt and tls.key, signed by the CA of "
            "nats.embedded.tls.existingSecret) for journal, timers-migrate",
        ),
        (
            _merge(_mtls(), {"nats": {"embedded": {"tls": {"existingSecret": ""}}}}),
            "needs nats.embedded.tls.existingSecret",
        ),
        # the external server's switch does not turn the embedded one's on
        (_merge(_mtls(), {"nats": {"tls": {"mutual": True}}}), "set nats.embedded.tls.mutual"),
        # a per-client Secret that would be ignored: an error, not a silent plain or server-only TLS
        (
            _merge(_mtls(), {"nats": {"embedded": {"tls": {"mutual": False}}}}),
            "nats.tls.clientCertSecrets (agent-collab, human-interaction, journal, run-executor, timers-migrate, tools, "
            "trigger-gateway) needs mutual TLS",
        ),
        (_external(mutual=False, clientCertSecrets={"journal": "nats-journal"}), "(journal) needs mutual TLS"),
        (
            {"nats": {"auth": {"existingSecret": NATS_SECRET}, "tls": {"clientCertSecrets": {"journal": "x"}}}},
            "(journal) needs mutual TLS",
        ),
        # a typo of a client's name
        (_external(clientCertSecrets={"agent-colab": "nats-agent-collab"}), "agent-colab"),
    ],
)
def test_values_that_would_weaken_or_break_mutual_tls_fail_the_render(values: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=re.escape(message)):
        _render(values)


def test_a_client_the_chart_does_not_render_needs_no_certificate() -> None:
    values = _merge(
        _mtls(),
        {
            "services": {"agent-collab": {"enabled": False}},
            "timersMigrate": {"enabled": False},
            "nats": {"tls": {"clientCertSecrets": {"agent-collab": "", "timers-migrate": ""}}},
        },
    )
    assert set(_pods(_render(values))) == set(CLIENTS) - {"agent-collab", "timers-migrate"}


def test_the_values_schema_knows_the_mutual_tls_values() -> None:
    values_schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    good = _merge(yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8")), _mtls())
    assert _validate(values_schema, good) == []
    assert _validate(values_schema, _merge(good, {"nats": {"tls": {"clientCertSecrets": {"jornal": "x"}}}}))
    assert _validate(values_schema, _merge(good, {"nats": {"embedded": {"tls": {"mutual": "yes"}}}}))


@pytest.mark.parametrize("kube", ["1.25.0", "latest"])
@pytest.mark.parametrize("rendering", ["embedded", "external"])
def test_the_mutual_tls_manifests_are_valid_kubernetes_objects(rendering: str, kube: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version() if kube == "latest" else kube
    values = _mtls(3) if rendering == "embedded" else _external(clientCertSecrets={"journal": "nats-journal"})
    problems = []
    for doc in _render(values):
        if doc["kind"] in {"Deployment", "Job", "StatefulSet", "ConfigMap"}:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{doc['kind']} {doc['metadata']['name']}: {exc.message}")
    assert problems == []


# --------------------------------------------------------------------------- a real nats-server


async def _connect_and_close(settings: NatsSettings, name: str, **options: Any) -> None:
    """Connect as ``settings`` say (its inbox ``name``'s), make a round trip and close."""
    nc = await nats.connect(
        settings.url,
        user=settings.user,
        password=settings.password.get_secret_value() if settings.password else None,
        tls=settings.ssl_context(),
        inbox_prefix=service_inbox(settings.user or name),
        allow_reconnect=False,
        max_reconnect_attempts=0,
        connect_timeout=5,
        **options,
    )
    try:
        await nc.flush(timeout=5)
    finally:
        await nc.close()


async def _refused(server: _RenderedNats, settings: NatsSettings, reason: str) -> None:
    """Connecting with ``settings`` fails, and the server's log says why: ``reason``."""
    seen = server.log.read_text(encoding="utf-8").count(reason) if server.log.exists() else 0
    with pytest.raises((ConnectionError, OSError, nats.errors.Error, TimeoutError)):
        await _connect_and_close(settings, "journal")

    async def logged() -> bool:
        return server.log.read_text(encoding="utf-8").count(reason) > seen

    await eventually(logged, timeout_s=10, what=f"nats-server to log {reason!r}")


async def test_the_rendered_mutual_tls_admits_each_client_with_its_own_certificate_and_refuses_the_rest(
    tmp_path: Path,
) -> None:
    ca = TestCA.create(tmp_path / "pki")
    server_cert = _server_cert(ca, "nats")
    secrets: dict[str, dict[str, Path]] = {
        TLS_SECRET: {"tls.crt": server_cert[0], "tls.key": server_cert[1], "ca.crt": ca.ca_file}
    }
    for name, secret in CLIENT_SECRETS.items():
        cert, key = ca.issue(name, server=False)  # CN=<client>, client auth only, as nats-tls-certs.sh makes
        secrets[secret] = {"tls.crt": cert, "tls.key": key, "ca.crt": ca.ca_file}
    docs = _render(_mtls(1))
    passwords = _nats_secret()
    env = {**os.environ, **_nats_pod_env(docs, f"{NATS_NAME}-0", passwords)}
    server = _start_rendered_nats(_local(_nats_conf(docs), ca, server_cert), tmp_path / "nats", env)
    try:
        await _ready(server, tmp_path / "nats")
        varz = await _varz(server.monitoring)
        assert varz["tls_required"] is True
        assert varz["tls_verify"] is True

        pods = _pods(docs)
        settings = {name: _settings(pod, server.url, passwords, secrets) for name, pod in pods.items()}
        # each client, with what its pod gets: its own certificate (no other's), its user and password
        for name, client in settings.items():
            assert client.tls_cert_file == secrets[CLIENT_SECRETS[name]]["tls.crt"], name
            await _connect_and_close(client, name)
        # the journal through the services' own Bus.connect
        async with Bus.connect(settings["journal"], name="journal", inbox_prefix=service_inbox("journal")) as bus:
            await bus.ensure([EVENTS_STREAM])
            assert (await bus.js.stream_info(EVENTS_STREAM.name)).config.name == EVENTS_STREAM.name

        journal = settings["journal"]
        # the CA alone (the embedded TLS without `mutual`): refused in the handshake, before it can log in
        no_cert = journal.model_copy(update={"tls_cert_file": None, "tls_key_file": None})
        await _refused(server, no_cert, "client didn't provide a certificate")
        # a `journal` certificate from another CA: refused
        stranger = TestCA.create(tmp_path / "stranger", name="another CA")
        cert, key = stranger.issue("journal", server=False)
        await _refused(
            server,
            journal.model_copy(update={"tls_cert_file": cert, "tls_key_file": key}),
            "certificate signed by unknown authority",
        )
        # its own certificate does not stand in for the password (`verify`, not `verify_and_map`)
        wrong = journal.model_copy(update={"password": SecretStr("not-the-journal-s")})
        await _refused(server, wrong, 'authentication error - User "journal"')

        # with its own certificate the gateway still has only its user's permissions
        violations: asyncio.Queue[Exception] = asyncio.Queue()

        async def on_error(error: Exception) -> None:
            await violations.put(error)

        gateway = settings["trigger-gateway"]
        nc = await nats.connect(
            gateway.url,
            user=gateway.user,
            password=gateway.password.get_secret_value() if gateway.password else None,
            tls=gateway.ssl_context(),
            inbox_prefix=service_inbox("trigger-gateway"),
            error_cb=on_error,
            allow_reconnect=False,
            connect_timeout=5,
        )
        try:
            ack = await nc.jetstream().publish("temporality.events.trigger.received", b"{}", timeout=10)
            assert ack.stream == EVENTS_STREAM.name
            await nc.publish("temporality.events.run.created", b"{}")  # the run-executor's event
            await nc.flush(timeout=5)
            refused = await asyncio.wait_for(violations.get(), timeout=10)
            assert "permissions violation" in str(refused).lower(), refused
            assert "temporality.events.run.created" in str(refused)
        finally:
            await nc.close()

        # an external NATS's old single Secret: its shared certificate (signed by the CA the server verifies
        # clients with) still logs every client in, as before per-client Secrets
        shared_cert, shared_key = ca.issue("temporality-client", server=False)
        shared = {SHARED: {"tls.crt": shared_cert, "tls.key": shared_key, "ca.crt": ca.ca_file}}
        for name, pod in _pods(_render(_external())).items():
            client = _settings(pod, server.url, passwords, shared)
            assert client.tls_cert_file == shared_cert, name
            await _connect_and_close(client, name)
    finally:
        _stop(server)
