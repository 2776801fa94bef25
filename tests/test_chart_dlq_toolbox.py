"""The chart's operator toolbox (``tools.enabled``, templates/tools.yaml): an idle pod with the ``temporality`` CLI,
logged in to NATS as ``dlq-operator``, for ``kubectl exec ... -- temporality dlq list`` (docs/operations.md, "Dead
letters").

Rendered with the Helm SDK as tests/test_deploy_files.py does and checked against the Kubernetes API's schemas;
then the rendered embedded NATS runs (its config, its environment from the Secret) and the toolbox's own rendered
environment logs in and runs ``temporality dlq list``."""

from __future__ import annotations

import asyncio
import json
import os
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_files import (
    CHART,
    NATS_NAME,
    NATS_SECRET,
    _embedded,
    _journal_bus,
    _kinds,
    _merge,
    _nats_conf,
    _render,
    _serving_rendered_nats,
    _validate,
)

from temporality_embedded.dlq import OPERATOR_USER
from temporality_embedded.natsserver import password_variable

TOOLS = "t-temporality-tools"
TEMPORALITY = Path(sysconfig.get_path("scripts")) / "temporality"


def _tools(**extra: Any) -> dict[str, Any]:
    """The embedded NATS with its users' Secret, and the toolbox on."""
    return _merge(_embedded(1, tools={"enabled": True}), extra)


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = _kinds(docs)[("Deployment", TOOLS)]["spec"]["template"]["spec"]
    return spec


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_off_by_default_but_the_embedded_nats_knows_the_user() -> None:
    docs = _render(_embedded(1))
    assert ("Deployment", TOOLS) not in _kinds(docs)
    (container,) = _kinds(docs)[("StatefulSet", NATS_NAME)]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["valueFrom"] for e in container["env"]}
    assert env[password_variable(OPERATOR_USER)] == {
        "secretKeyRef": {"name": NATS_SECRET, "key": "dlq-operator-password"}
    }, "its password is the server's even with the toolbox off (the user is in files/nats-authorization.conf)"
    assert f'"user": "{OPERATOR_USER}"' in _nats_conf(docs)


def test_the_toolbox_is_an_idle_unreachable_pod_logged_in_as_dlq_operator() -> None:
    docs = _render(_tools())
    deployment = _kinds(docs)[("Deployment", TOOLS)]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "tools"
    pod = _pod(docs)
    (container,) = pod["containers"]
    assert container["image"] == "temporality-tools:0.1.0", "the Dockerfile's tools target, the chart's tag"
    assert container["command"] == ["sleep", "infinity"]
    assert "ports" not in container
    assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(container)
    assert ("Service", TOOLS) not in _kinds(docs)
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    env = _env(pod)
    assert env == {
        "TEMPORALITY_NATS_URL": "nats://t-temporality-nats:4222",
        "TEMPORALITY_NATS_USER": OPERATOR_USER,
        "TEMPORALITY_NATS_PASSWORD": {"secretKeyRef": {"name": NATS_SECRET, "key": "dlq-operator-password"}},
    }
    # the same Secret key the embedded server reads the user's password from
    (server,) = _kinds(docs)[("StatefulSet", NATS_NAME)]["spec"]["template"]["spec"]["containers"]
    server_env = {e["name"]: e["valueFrom"] for e in server["env"]}
    assert server_env[password_variable(OPERATOR_USER)] == env["TEMPORALITY_NATS_PASSWORD"]
    notes = _helm_notes(_tools())
    assert f"kubectl exec -n default -it deploy/{TOOLS} -- temporality dlq list" in notes


def _helm_notes(values: dict[str, Any]) -> str:
    from test_deploy_files import _helm

    chart = _helm().Chart.load(CHART)
    try:
        manifests: dict[str, str] = chart.render(values, name="t", namespace="default", is_install=True)
    finally:
        chart.close()
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def test_its_own_secret_image_and_the_deployment_s_redaction_patterns() -> None:
    values = _tools(
        tools={"image": {"repository": "registry.example/ops", "tag": "9"}, "existingSecret": {"name": "ops-nats"}},
        redaction={"patterns": {"ticket": "TKT-(?P<secret>[0-9a-f]{4})$(x)"}},
    )
    docs = _render(values)
    pod = _pod(docs)
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/ops:9"
    env = _env(pod)
    assert env["TEMPORALITY_NATS_PASSWORD"] == {"secretKeyRef": {"name": "ops-nats", "key": "dlq-operator-password"}}
    (server,) = _kinds(docs)[("StatefulSet", NATS_NAME)]["spec"]["template"]["spec"]["containers"]
    server_env = {e["name"]: e["valueFrom"] for e in server["env"]}
    assert server_env[password_variable(OPERATOR_USER)] == env["TEMPORALITY_NATS_PASSWORD"]
    # `dlq show` redacts with the patterns the services do; `$` doubled for the kubelet, as theirs
    patterns = env["TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS"]
    assert json.loads(patterns.replace("$$", "$")) == {"ticket": "TKT-(?P<secret>[0-9a-f]{4})$(x)"}
    executor = _kinds(docs)[("Deployment", "t-temporality-run-executor")]["spec"]["template"]["spec"]
    assert patterns == _env(executor)["TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS"]


def test_an_external_nats_with_tls_gives_the_toolbox_its_ca_and_domain() -> None:
    values = {
        "nats": {
            "url": "tls://nats.example:4222",
            "auth": {"existingSecret": NATS_SECRET},
            "tls": {"existingSecret": "nats-ca"},
            "jetstreamDomain": "hub",
        },
        "tools": {"enabled": True},
    }
    pod = _pod(_render(values))
    env = _env(pod)
    assert env["TEMPORALITY_NATS_URL"] == "tls://nats.example:4222"
    assert env["TEMPORALITY_NATS_JETSTREAM_DOMAIN"] == "hub"
    assert env["TEMPORALITY_NATS_TLS_CA_FILE"] == "/etc/temporality/nats-tls/ca.crt"
    assert "TEMPORALITY_NATS_TLS_CERT_FILE" not in env
    # only the CA of the Secret (a cert-manager Secret holds a tls.key too)
    ca_only = {"secretName": "nats-ca", "defaultMode": 0o400, "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert {"name": "nats-tls", "secret": ca_only} in pod["volumes"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tools": {"enabled": True}}, "tools.enabled needs NATS users"),
        (_tools(tools={"user": "ops"}), "the embedded NATS's user for the operator's toolbox is dlq-operator"),
        (
            _tools(nats={"embedded": {"tls": {"existingSecret": "nats-tls", "mutual": True}}}),
            "trigger-gateway, timers-migrate, tools",
        ),
    ],
)
def test_values_that_cannot_work_fail_the_render(values: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=message):
        _render(values)


def test_mutual_tls_mounts_the_toolbox_its_own_certificate() -> None:
    clients = ("trigger-gateway", "run-executor", "human-interaction", "agent-collab", "journal", "timers-migrate")
    secrets = {name: f"nats-client-{name}" for name in (*clients, "tools")}
    values = _tools(
        nats={
            "embedded": {"tls": {"existingSecret": "nats-tls", "mutual": True}},
            "tls": {"clientCertSecrets": secrets},
        }
    )
    pod = _pod(_render(values))
    env = _env(pod)
    assert env["TEMPORALITY_NATS_TLS_CERT_FILE"] == "/etc/temporality/nats-tls/tls.crt"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "nats-tls"]
    sources = [s["secret"]["name"] for s in volume["projected"]["sources"]]
    assert sources == ["nats-tls", "nats-client-tools"]


def test_the_values_and_schema_know_the_toolbox(values_schema: dict[str, Any]) -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert defaults["tools"]["enabled"] is False
    assert defaults["tools"]["user"] == OPERATOR_USER
    assert _validate(values_schema, _merge(defaults, _tools())) == []
    typo = _merge(defaults, {"tools": {"enable": True}})
    assert any("tools" in e and "enable" in e for e in _validate(values_schema, typo))
    bad_user = _merge(defaults, {"tools": {"user": "a.b"}})
    assert _validate(values_schema, bad_user)


def test_with_network_policies_only_dns_and_nats_and_nothing_in() -> None:
    docs = _render(_tools(networkPolicy={"enabled": True}))
    kinds = _kinds(docs)
    policy = kinds[("NetworkPolicy", TOOLS)]["spec"]
    assert policy["ingress"] == []
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    ports = [{(p["port"], p["protocol"]) for p in rule["ports"]} for rule in policy["egress"]]
    assert ports == [{(53, "UDP"), (53, "TCP")}, {(4222, "TCP")}]
    assert policy["egress"][1]["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "nats"
    nats_ingress = kinds[("NetworkPolicy", NATS_NAME)]["spec"]["ingress"][0]
    (clients,) = nats_ingress["from"]
    (expression,) = clients["podSelector"]["matchExpressions"]
    assert "tools" in expression["values"], "the embedded NATS admits the toolbox's pod"


@pytest.mark.parametrize("kube", ["1.25.0", "latest"])
def test_the_toolbox_manifests_are_valid_kubernetes_objects(kube: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version() if kube == "latest" else kube
    checked = 0
    for doc in _render(_tools(networkPolicy={"enabled": True})):
        if doc["metadata"]["name"] == TOOLS:
            kubernetes_validate.validate(doc, version, strict=True)
            checked += 1
    assert checked == 2, "the Deployment and its NetworkPolicy"


@pytest.fixture(scope="module")
def values_schema() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    return doc


@pytest.mark.timeout(180)
async def test_the_rendered_toolbox_runs_dlq_list_on_the_rendered_nats(tmp_path: Path) -> None:
    """The rendered server config with its rendered environment (the Secret's passwords), and the toolbox's
    rendered environment (its Secret key) running ``temporality dlq list`` as its pod would after ``kubectl exec``."""
    docs = _render(_tools())
    async with _serving_rendered_nats(docs, tmp_path / "nats") as (server, passwords):
        async with _journal_bus(server, passwords) as bus:
            await bus.publish_raw("temporality.dlq.journal", b"{}", {"Temporality-Error": "PermanentError: seen"})
        pod_env: dict[str, str] = {}
        for name, value in _env(_pod(docs)).items():
            pod_env[name] = passwords[value["secretKeyRef"]["key"]] if isinstance(value, dict) else value
        pod_env["TEMPORALITY_NATS_URL"] = server.url  # the client Service, here
        process = await asyncio.create_subprocess_exec(
            str(TEMPORALITY),
            "dlq",
            "list",
            env={**{k: v for k, v in os.environ.items() if not k.startswith("TEMPORALITY_")}, **pod_env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0, err.decode()
        assert "PermanentError: seen" in out.decode()
        assert "1 dead letter(s)" in out.decode()


def test_the_toolbox_follows_the_global_scheduling_and_pod_security_context() -> None:
    """Where every pod may run and as whom (tolerations, affinity, nodeSelector; podSecurityContext, e.g. OpenShift's
    user assigned by the platform), as the timers migration's Job: one pod, so no spread constraint."""
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "temporality", "effect": "NoSchedule"}]
    spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}]
    values = _tools(
        tolerations=tolerations,
        nodeSelector={"pool": "ops"},
        topologySpreadConstraints=spread,
        podSecurityContext={"runAsUser": None, "runAsGroup": None, "fsGroup": None},
    )
    pod = _pod(_render(values))
    assert pod["tolerations"] == tolerations
    assert pod["nodeSelector"] == {"pool": "ops"}
    assert "topologySpreadConstraints" not in pod
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
