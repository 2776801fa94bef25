"""Issue 11: the chart's NetworkPolicies allow each pod only the bus and database traffic it needs.

By default (``networkPolicy.egress.allowAll``, per pod) the trigger-gateway, agent-collab, the journal and the timers
migration's Job may reach only DNS, NATS (the embedded pods, or an external ``nats.url``'s ports towards
``egress.nats.to``) and, for the journal, its PostgreSQL, its two proxies and its OIDC provider, plus the tracing
collector when tracing is on; the run-executor (model provider, MCP servers) and human-interaction (Matrix, Telegram,
SMTP) may connect anywhere until restricted. Rendered with the Helm SDK and read rule by rule, as
tests/test_deploy_files.py does for ingress; every rendering here is also checked against the Kubernetes API's
schemas (kubernetes-validate, strict).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from test_deploy_files import (
    _SIGN_IN,
    CATALOGUE,
    CHART,
    SERVICES,
    _embedded,
    _merge,
    _network_policy_comment,
    _notes,
    _pods,
    _policies,
    _render,
    _validate,
)

from temporality_protocol.permissions import TIMERS_MIGRATION_USER

#: Every pod kind a NetworkPolicy selects besides the embedded NATS: the five services and the timers migration.
PODS = (*SERVICES, TIMERS_MIGRATION_USER)
#: The two that talk to the world outside the cluster, open by default.
OUTSIDE = {"run-executor", "human-interaction"}
DNS = [{"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}]
ANYWHERE = [{}]
PG_PEERS = [{"ipBlock": {"cidr": "10.0.5.0/24"}}]
NATS_PEERS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "nats"}}}]
COLLECTOR_PEERS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]
SSO_PEERS = [{"ipBlock": {"cidr": "192.0.2.10/32"}}]


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return doc


@pytest.fixture(scope="module")
def values_schema() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    return doc


def _tcp(port: int, to: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"ports": [{"port": port, "protocol": "TCP"}]}
    if to is not None:
        rule["to"] = to
    return rule


def _selector(name: str) -> dict[str, Any]:
    return {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "temporality",
                "app.kubernetes.io/instance": "t",
                "app.kubernetes.io/component": name,
            }
        }
    }


def _egress(values: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    docs = _render(_merge({"networkPolicy": {"enabled": True}}, values))
    return {name: policy["egress"] for name, policy in _policies(docs).items()}


def _with_timers_migrate(values: dict[str, Any]) -> dict[str, Any]:
    """The migration's Job (and its policy) is rendered only with NATS users."""
    return _merge({"nats": {"auth": {"existingSecret": "nats-users"}}}, values)


def test_by_default_only_the_run_executor_and_human_interaction_reach_outside() -> None:
    """The embedded NATS: the three bus-only services and the Job get DNS and the NATS pods' 4222, nothing else;
    the journal also its two proxies (SQLite here: no database rule)."""
    egress = _egress(_embedded(1))
    assert set(egress) == {*PODS, "nats", "test-connection"}  # the `helm test` pod's: tests/test_chart_test_pod.py
    nats = _tcp(4222, [_selector("nats")])
    for name in PODS:
        if name in OUTSIDE:
            assert egress[name] == ANYWHERE, name
        elif name == "journal":
            proxies = [
                _tcp(CATALOGUE[target].http_port or 0, [_selector(target)])
                for target in ("trigger-gateway", "human-interaction")
            ]
            assert egress[name] == [*DNS, nats, *proxies], name
        else:
            assert egress[name] == [*DNS, nats], name


def test_an_external_nats_is_reached_on_the_ports_of_its_urls_towards_its_peers() -> None:
    """``nats.url``: every URL's port (4222 where it names none), towards ``egress.nats.to`` (anywhere if empty);
    the same for the Job."""
    url = "nats://n1.nats.svc:4222, tls://n2.nats.svc:4223,nats://n3.nats.svc"
    egress = _egress(_with_timers_migrate({"nats": {"url": url}}))
    expected = {"ports": [{"port": 4222, "protocol": "TCP"}, {"port": 4223, "protocol": "TCP"}]}
    for name in ("trigger-gateway", "agent-collab", "journal", TIMERS_MIGRATION_USER):
        assert egress[name][:2] == [*DNS, expected], name
    fenced = _egress(
        _with_timers_migrate({"nats": {"url": url}, "networkPolicy": {"egress": {"nats": {"to": NATS_PEERS}}}})
    )
    for name in ("trigger-gateway", "agent-collab", "journal", TIMERS_MIGRATION_USER):
        assert fenced[name][:2] == [*DNS, {**expected, "to": NATS_PEERS}], name
    assert fenced["run-executor"] == ANYWHERE


@pytest.mark.parametrize(
    ("postgres", "port"),
    [
        ({"url": "postgresql+asyncpg://journal:pw@db.example:6432/temporality"}, 6432),  # the URL's port
        ({"url": "postgresql+asyncpg://journal:pw@db.example/temporality"}, 5432),  # none: egress.postgres.port
        # the URL in a Secret of yours: the chart cannot read it, egress.postgres.port says
        ({"existingSecret": {"name": "db"}, "url": "postgresql+asyncpg://j@ignored:1111/t"}, 5433),
    ],
)
def test_the_journal_reaches_its_postgresql_and_no_other_pod_does(postgres: dict[str, Any], port: int) -> None:
    values = {"postgres": postgres, "networkPolicy": {"egress": {"postgres": {"to": PG_PEERS}}}}
    if "existingSecret" in postgres:
        values["networkPolicy"]["egress"]["postgres"]["port"] = port
    egress = _egress(values)
    database = _tcp(port, PG_PEERS)
    assert database in egress["journal"]
    for name in ("trigger-gateway", "agent-collab"):
        assert all(rule.get("ports") != database["ports"] for rule in egress[name]), name
    # no peers named: the port, to any address
    del values["networkPolicy"]["egress"]["postgres"]["to"]
    assert _tcp(port) in _egress(values)["journal"]


def test_oidc_and_tracing_endpoints_are_reached_on_their_ports() -> None:
    """With ``signIn.oidc.issuer`` the journal reaches its provider (https: 443); with ``tracing.otlpEndpoint`` every
    restricted service reaches the collector on the endpoint's port; the Job exports no traces."""
    values = _merge(
        _with_timers_migrate(_SIGN_IN),
        {
            "tracing": {"otlpEndpoint": "http://otel-collector.observability:4318"},
            "networkPolicy": {"egress": {"tracing": {"to": COLLECTOR_PEERS}, "oidc": {"to": SSO_PEERS}}},
        },
    )
    egress = _egress(values)
    collector = _tcp(4318, COLLECTOR_PEERS)
    for name in ("trigger-gateway", "agent-collab", "journal"):
        assert collector in egress[name], name
    assert collector not in egress[TIMERS_MIGRATION_USER]
    assert _tcp(443, SSO_PEERS) in egress["journal"]
    assert all(_tcp(443, SSO_PEERS) != rule for name in ("trigger-gateway", "agent-collab") for rule in egress[name])
    plain = _egress(_merge(_SIGN_IN, {"tracing": {"otlpEndpoint": "https://otlp.example.com"}}))
    assert _tcp(443) in plain["trigger-gateway"]  # https without a port
    assert _tcp(443) in plain["journal"]


def test_each_pod_can_be_opened_or_restricted_and_the_boolean_sets_every_pod() -> None:
    restricted = _egress(
        _with_timers_migrate(
            {
                "networkPolicy": {
                    "egress": {
                        "allowAll": {"run-executor": False, "human-interaction": False, "journal": True},
                        "extra": {"run-executor": [_tcp(443, [{"ipBlock": {"cidr": "203.0.113.0/24"}}])]},
                    }
                }
            }
        )
    )
    assert restricted["journal"] == ANYWHERE
    assert restricted["run-executor"] == [*DNS, _tcp(4222), _tcp(443, [{"ipBlock": {"cidr": "203.0.113.0/24"}}])]
    assert restricted["human-interaction"] == [*DNS, _tcp(4222)]
    assert restricted["trigger-gateway"] == [*DNS, _tcp(4222)], "the defaults of the pods not named stay"
    # the boolean (the form before per-pod settings) still means every pod
    for value in (True, False):
        egress = _egress(_with_timers_migrate({"networkPolicy": {"egress": {"allowAll": value}}}))
        for name in PODS:
            assert (egress[name] == ANYWHERE) is value, (name, value)


def test_the_notes_name_the_pods_that_may_connect_anywhere() -> None:
    notes = _notes({"networkPolicy": {"enabled": True}})
    assert "egress anywhere for: run-executor, human-interaction;" in notes
    notes = _notes({"networkPolicy": {"enabled": True, "egress": {"allowAll": False}}})
    assert "egress anywhere for: none;" in notes


def test_the_documented_peer_examples_validate_and_render(
    values: dict[str, Any], values_schema: dict[str, Any]
) -> None:
    """The examples of values.yaml's egress comments (YAML flow values in backquotes) as `to` peers."""
    comment = _network_policy_comment()
    found = [yaml.safe_load(text) for text in re.findall(r"`(\[\{(?:ipBlock|namespaceSelector)[^`]*\])`", comment)]
    peers = [p for p in found if p and "ingress-nginx" not in str(p)]
    assert len(peers) >= 2, peers
    for example in peers:
        documented = {
            "nats": {"url": "nats://nats.example:4222"},
            "postgres": {"url": "postgresql+asyncpg://j@db.example/t"},
            "networkPolicy": {"enabled": True, "egress": {"nats": {"to": example}, "postgres": {"to": example}}},
        }
        assert _validate(values_schema, _merge(values, documented)) == []
        egress = _egress(documented)["journal"]
        assert _tcp(4222, example) in egress
        assert _tcp(5432, example) in egress


@pytest.mark.parametrize(
    "extra",
    [
        {"allowAll": {"run-executer": True}},  # a typo
        {"allowAll": {"journal": "yes"}},
        {"allowAll": "false"},
        {"nats": {"to": [{}]}},  # an empty peer would admit everything
        {"postgres": {"port": 0}},
        {"postgres": {"to": [], "ports": [5432]}},
        {"tracing": {"endpoint": "x"}},
        {"oidc": {"to": [{"ipBlock": {}}]}},
    ],
)
def test_bad_egress_values_fail(values: dict[str, Any], values_schema: dict[str, Any], extra: dict[str, Any]) -> None:
    assert _validate(values_schema, _merge(values, {"networkPolicy": {"egress": extra}}))


#: Renderings that reach every egress rule the chart derives.
_RENDERINGS = {
    "embedded": _embedded(3, networkPolicy={"enabled": True}),
    "external": _merge(
        _with_timers_migrate(_SIGN_IN),
        {
            "nats": {"url": "tls://n1.nats:4222,tls://n2.nats:4223"},
            "postgres": {"url": "postgresql+asyncpg://j@db.example:6432/t"},
            "tracing": {"otlpEndpoint": "http://otel-collector.observability:4318"},
            "networkPolicy": {
                "enabled": True,
                "egress": {
                    "allowAll": {"run-executor": False},
                    "nats": {"to": NATS_PEERS},
                    "postgres": {"to": PG_PEERS},
                    "oidc": {"to": SSO_PEERS},
                    "tracing": {"to": COLLECTOR_PEERS},
                    "extra": {"run-executor": [_tcp(443, [{"ipBlock": {"cidr": "203.0.113.0/24"}}])]},
                },
            },
        },
    ),
}


@pytest.mark.parametrize("rendering", sorted(_RENDERINGS))
def test_the_network_policies_are_valid_kubernetes_objects(rendering: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = _render(_RENDERINGS[rendering])
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert len(policies) == len(_policies(docs)) >= len(SERVICES)
    assert set(_pods(docs)) >= set(SERVICES)
    problems = []
    for kube in ("1.25.0", kubernetes_validate.latest_version()):
        for doc in policies:
            try:
                kubernetes_validate.validate(doc, kube, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{kube} {doc['metadata']['name']}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert problems == [], "\n".join(problems)
