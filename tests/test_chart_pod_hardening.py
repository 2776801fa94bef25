"""What a DevOps review of the rendered chart asked for, each rendered with the Helm SDK as tests/test_deploy_files.py
does: no pod holds a Kubernetes API token, the journal rolls when the database URL of the chart's Secret changes,
a client of an external NATS without mutual TLS mounts the CA of its Secret only, and human-interaction without its
Ingress is reachable from the journal (and the scrapers) only."""

from __future__ import annotations

from typing import Any

from test_deploy_files import _deployments, _embedded, _merge, _render

PG = "postgresql+asyncpg://tempo:first@db.example:5432/tempo"


def _pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    specs: dict[str, dict[str, Any]] = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            specs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc["spec"]["template"]["spec"]
        elif doc["kind"] == "Pod":
            specs[f"Pod/{doc['metadata']['name']}"] = doc["spec"]
    return specs


def test_no_pod_template_mounts_a_service_account_token() -> None:
    """Nothing of the chart talks to the Kubernetes API: whoever gets into a pod finds no token there."""
    values = _embedded(3, tools={"enabled": True})
    specs = _pod_specs(_render(values))
    kinds = {name.split("/")[0] for name in specs}
    assert kinds == {"Deployment", "StatefulSet", "Job", "Pod"}, sorted(specs)
    assert len([n for n in specs if n.startswith("Deployment/")]) == 6  # the five services and the toolbox
    for name, spec in specs.items():
        assert spec.get("automountServiceAccountToken") is False, name


def _journal_checksum(values: dict[str, Any]) -> str | None:
    annotations = _deployments(values)["journal"]["spec"]["template"]["metadata"]["annotations"]
    checksum: str | None = annotations.get("checksum/secret")
    return checksum


def test_the_journal_rolls_when_the_chart_s_database_secret_changes() -> None:
    """The journal reads TEMPORALITY_DATABASE_URL at start only: a new password in postgres.url changes the chart's
    Secret, and with it the journal's pod template (a rollout), the other pods' not (they do not read it)."""
    first = _journal_checksum({"postgres": {"url": PG}})
    second = _journal_checksum({"postgres": {"url": PG.replace("first", "second")}})
    assert first
    assert second
    assert first != second
    assert _journal_checksum({"postgres": {"url": PG}}) == first  # stable: no rollout without a change
    others = _deployments({"postgres": {"url": PG}})
    assert all(
        "checksum/secret" not in d["spec"]["template"]["metadata"]["annotations"]
        for d in others.values()
        if d is not others["journal"]
    )
    # no chart-made Secret (your own, or SQLite): nothing to watch
    assert _journal_checksum({"postgres": {"existingSecret": {"name": "pg"}}}) is None
    assert _journal_checksum({}) is None


def _nats_tls_volumes(values: dict[str, Any]) -> dict[str, Any]:
    return {
        name: next(v for v in spec["volumes"] if v["name"] == "nats-tls")
        for name, spec in _pod_specs(_render(values)).items()
        if any(v["name"] == "nats-tls" for v in spec.get("volumes", []))
    }


def test_an_external_nats_without_mutual_tls_gives_every_client_the_ca_only() -> None:
    """nats.tls.existingSecret is often a cert-manager Secret, with the tls.key of whatever certificate it is: a
    client that presents no certificate mounts its ca.crt and nothing else (mutual TLS mounts the shared
    certificate and key too, and no other key: tests/test_chart_nats_mtls.py)."""
    values = {
        "nats": {"url": "tls://nats.example:4222", "auth": {"existingSecret": "nats-users"}},
        "tools": {"enabled": True},
    }
    volumes = _nats_tls_volumes(_merge(values, {"nats": {"tls": {"existingSecret": "nats-ca"}}}))
    assert len(volumes) == 7  # the five services, the timers migration, the toolbox
    for name, volume in volumes.items():
        assert volume["secret"] == {
            "secretName": "nats-ca",
            "defaultMode": 0o400,
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        }, name


def _ingress(values: dict[str, Any], name: str = "human-interaction") -> list[dict[str, Any]]:
    [policy] = [
        d
        for d in _render(_merge({"networkPolicy": {"enabled": True}}, values))
        if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == f"t-temporality-{name}"
    ]
    rules: list[dict[str, Any]] = policy["spec"]["ingress"]
    return rules


JOURNAL = {
    "podSelector": {
        "matchLabels": {
            "app.kubernetes.io/name": "temporality",
            "app.kubernetes.io/instance": "t",
            "app.kubernetes.io/component": "journal",
        }
    }
}
SCRAPERS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
PORT = [{"port": 8081, "protocol": "TCP"}]


def test_human_interaction_without_its_ingress_admits_the_journal_and_the_scrapers_only() -> None:
    """People reach their inbox through the journal's /human/ proxy: without ingress.human-interaction nothing else
    needs port 8081, so an empty ingressFrom no longer means every pod of the cluster."""
    assert _ingress({}) == [{"ports": PORT, "from": [JOURNAL]}]
    assert _ingress({"networkPolicy": {"metricsFrom": [SCRAPERS]}}) == [{"ports": PORT, "from": [SCRAPERS, JOURNAL]}]
    # no journal, no scrapers: no rule at all (an empty `from` would admit everyone)
    assert _ingress({"services": {"journal": {"enabled": False}}}) == []
    # with its Ingress, an empty ingressFrom is "from anywhere" as for the other HTTP services
    ingress = {"ingress": {"human-interaction": {"enabled": True, "host": "inbox.example.org"}}}
    assert _ingress(ingress) == [{"ports": PORT}]
    # and your own list, as before: it, the scrapers, the journal
    own = [{"ipBlock": {"cidr": "10.1.0.0/16"}}]
    assert _ingress({"networkPolicy": {"ingressFrom": {"human-interaction": own}}}) == [
        {"ports": PORT, "from": [*own, JOURNAL]}
    ]
    # the journal and the trigger-gateway: from anywhere by default, as before (the console, webhooks)
    assert _ingress({}, "journal") == [{"ports": [{"port": 8082, "protocol": "TCP"}]}]
    assert _ingress({}, "trigger-gateway") == [{"ports": [{"port": 8080, "protocol": "TCP"}]}]
