"""Where the chart's pods run and as whom: ``tolerations``, ``affinity`` and ``topologySpreadConstraints`` (global,
replaced per service or for the embedded NATS), ``podSecurityContext`` (the fixed user ids a platform such as
OpenShift's restricted SCC must be able to remove) and the optional PodDisruptionBudgets of services with more than
one replica. Rendered with the Helm SDK and read as YAML, as tests/test_deploy_files.py does; no cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from test_deploy_files import CHART, NATS_NAME, SERVICES, _embedded, _helm, _kinds, _merge, _render, _validate

TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "temporality", "effect": "NoSchedule"}
NODE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["apps"]}]}]
        }
    }
}
ZONE_SPREAD = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
JOB = "t-temporality-timers-migrate"


def _selector(component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "temporality",
        "app.kubernetes.io/instance": "t",
        "app.kubernetes.io/component": component,
    }


def _pods(values: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Every pod template the chart renders, by component: the five services, `nats`, `timers-migrate`."""
    pods: dict[str, dict[str, Any]] = {}
    for doc in _render(values):
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            component = doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            pods[component] = doc["spec"]["template"]["spec"]
    return pods


def _values_errors(extra: dict[str, Any]) -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return _validate(schema, _merge(values, extra))


def _spread_replicas(name: str) -> dict[str, Any]:
    """The chart's default preference for a service's replicas (defaultPodAntiAffinity): one per node."""
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": _selector(name)}}
    return {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}


def test_by_default_no_pod_gets_tolerations_affinity_or_spread() -> None:
    """... but the services' replicas prefer different nodes (defaultPodAntiAffinity)."""
    pods = _pods(_embedded(1))
    assert set(pods) == {*SERVICES, "nats", "timers-migrate"}
    for name, pod in pods.items():
        assert not {"tolerations", "topologySpreadConstraints"} & set(pod), name
        if name in SERVICES:
            assert pod["affinity"] == {"podAntiAffinity": _spread_replicas(name)}, name
        else:
            assert "affinity" not in pod, name


def test_the_replicas_preference_gives_way_to_an_anti_affinity_of_your_own_or_is_turned_off() -> None:
    """A node lost takes one replica of a service, not all of them, where there are nodes enough (a preference: the
    scheduler still places them together otherwise). Your own podAntiAffinity (the service's, else the global)
    replaces it; defaultPodAntiAffinity: false drops it, keeping the rest of the affinity."""
    own_anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"team": "x"}}}
            ]
        }
    }
    pods = _pods(_embedded(1, affinity=NODE_AFFINITY, services={"journal": {"affinity": own_anti}}))
    assert pods["journal"]["affinity"] == own_anti
    for name in set(SERVICES) - {"journal"}:
        assert pods[name]["affinity"] == {**NODE_AFFINITY, "podAntiAffinity": _spread_replicas(name)}, name
    assert pods["timers-migrate"]["affinity"] == NODE_AFFINITY  # a one-shot: no replicas to spread
    off = _pods(_embedded(1, affinity=NODE_AFFINITY, defaultPodAntiAffinity=False))
    assert all(off[name]["affinity"] == NODE_AFFINITY for name in SERVICES)
    assert all("affinity" not in pod for pod in _pods(_embedded(1, defaultPodAntiAffinity=False)).values())
    assert _values_errors({"defaultPodAntiAffinity": False}) == []
    assert _values_errors({"defaultPodAntiAffinity": "soft"})


def test_the_global_settings_reach_every_pod_and_a_service_s_own_replace_them() -> None:
    values = _embedded(
        3,
        tolerations=[TOLERATION],
        affinity=NODE_AFFINITY,
        topologySpreadConstraints=[ZONE_SPREAD],
        nodeSelector={"kubernetes.io/os": "linux"},
        services={
            "journal": {
                "tolerations": [{"key": "db", "operator": "Exists"}],
                "topologySpreadConstraints": [
                    {**ZONE_SPREAD, "labelSelector": {"matchLabels": {"team": "journal"}}}  # kept as given
                ],
            }
        },
    )
    pods = _pods(values)
    for name in SERVICES:
        pod = pods[name]
        assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}, name
        assert pod["affinity"] == {**NODE_AFFINITY, "podAntiAffinity": _spread_replicas(name)}, name
        if name == "journal":
            assert pod["tolerations"] == [{"key": "db", "operator": "Exists"}]
            assert pod["topologySpreadConstraints"] == [
                {**ZONE_SPREAD, "labelSelector": {"matchLabels": {"team": "journal"}}}
            ]
            continue
        assert pod["tolerations"] == [TOLERATION], name
        # a constraint without labelSelector counts the pods of its own Deployment
        assert pod["topologySpreadConstraints"] == [{**ZONE_SPREAD, "labelSelector": {"matchLabels": _selector(name)}}]
    # the embedded NATS: the global ones, its spread counting the servers, and its one-server-per-node preference
    nats = pods["nats"]
    assert nats["tolerations"] == [TOLERATION]
    assert nats["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert nats["affinity"]["nodeAffinity"] == NODE_AFFINITY["nodeAffinity"]
    (preferred,) = nats["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["podAffinityTerm"]["labelSelector"] == {"matchLabels": _selector("nats")}
    assert nats["topologySpreadConstraints"] == [{**ZONE_SPREAD, "labelSelector": {"matchLabels": _selector("nats")}}]
    # the timers migration's Job: tolerations and affinity (a one-shot: no spread)
    job = pods["timers-migrate"]
    assert job["tolerations"] == [TOLERATION]
    assert job["affinity"] == NODE_AFFINITY
    assert "topologySpreadConstraints" not in job


def test_the_embedded_nats_takes_its_own_settings_and_keeps_a_pod_anti_affinity_given() -> None:
    own_anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": _selector("nats")}}
            ]
        }
    }
    nats_values = {"embedded": {"tolerations": [{"key": "nats", "operator": "Exists"}], "affinity": own_anti}}
    pods = _pods(_embedded(3, tolerations=[TOLERATION], nats=nats_values))
    assert pods["nats"]["tolerations"] == [{"key": "nats", "operator": "Exists"}]
    assert pods["nats"]["affinity"] == own_anti, "its own podAntiAffinity, not the chart's preference beside it"
    assert pods["journal"]["tolerations"] == [TOLERATION], "the services keep the global ones"
    # one server: no anti-affinity of the chart's
    assert "affinity" not in _pods(_embedded(1))["nats"]


def test_the_pod_security_context_is_the_values_and_a_null_removes_a_fixed_id() -> None:
    pods = _pods(_embedded(1))
    fixed = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001}
    for name in (*SERVICES, "timers-migrate"):
        assert pods[name]["securityContext"] == {**fixed, "seccompProfile": {"type": "RuntimeDefault"}}, name
    assert pods["nats"]["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # OpenShift's restricted SCC assigns the ids: the README's nulls leave them out, runAsNonRoot and seccomp stay
    nulls = {"runAsUser": None, "runAsGroup": None, "fsGroup": None}
    pods = _pods(_embedded(1, podSecurityContext=nulls, nats={"embedded": {"podSecurityContext": nulls}}))
    for name, pod in pods.items():
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}, name
    # the run-executor's own seccomp profile survives an override of the rest
    localhost = {"type": "Localhost", "localhostProfile": "profiles/temporality-userns.json"}
    pods = _pods({"podSecurityContext": nulls, "services": {"run-executor": {"seccompProfile": localhost}}})
    assert pods["run-executor"]["securityContext"] == {"runAsNonRoot": True, "seccompProfile": localhost}


def test_without_the_new_keys_the_pods_keep_the_chart_s_fixed_ids() -> None:
    """`helm upgrade --reuse-values` of a release made before these values reuses the old chart's defaults, which
    lack them (a null removes a key the same way): the pods still run as the images' users, never as root."""
    values = _embedded(
        1, podSecurityContext=None, podDisruptionBudget=None, nats={"embedded": {"podSecurityContext": None}}
    )
    pods = _pods(values)
    for name, pod in pods.items():
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == (1000 if name == "nats" else 10001), name


def test_the_readme_s_openshift_command_removes_every_fixed_id() -> None:
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("**OpenShift**") :]
    block = block[block.index("```bash") : block.index("```", block.index("```bash") + 3)]
    sets = [s.split("=", 1)[0] for s in block.split("--set ")[1:]]
    assert sorted(sets) == sorted(
        [
            *(
                f"{prefix}.{field}"
                for prefix in ("podSecurityContext", "nats.embedded.podSecurityContext")
                for field in ("runAsUser", "runAsGroup", "fsGroup")
            ),
            "tests.podSecurityContext.runAsUser",  # helm test's pod: the curl image's user only
        ]
    )
    # applied, no pod the chart renders (embedded NATS, the toolbox, helm test's) keeps a fixed id
    values: dict[str, Any] = _embedded(1, tools={"enabled": True})
    for name in sets:
        *path, leaf = name.split(".")
        node = values
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = None
    pods = [
        spec
        for d in _render(values)
        if (spec := d["spec"] if d["kind"] == "Pod" else d.get("spec", {}).get("template", {}).get("spec"))
    ]
    assert len(pods) > len(SERVICES)
    for spec in pods:
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(spec.get("securityContext", {})), spec


def _budgets(values: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"].removeprefix("t-temporality-"): d
        for d in _render(values)
        if d["kind"] == "PodDisruptionBudget"
    }


def test_a_disruption_budget_for_each_enabled_service_with_more_than_one_replica_when_asked() -> None:
    replicas = {
        "services": {
            "run-executor": {"replicas": 3},
            "human-interaction": {"replicas": 2},
            "agent-collab": {"replicas": 2, "enabled": False},
        },
        "postgres": {"url": "postgresql://journal@db.example/temporality"},
    }
    assert _budgets(replicas) == {}, "off by default"
    budgets = _budgets(_merge(replicas, {"podDisruptionBudget": {"enabled": True}}))
    assert set(budgets) == {"run-executor", "human-interaction"}, (
        "one replica or disabled: none (it would block drains)"
    )
    deployments = {d["metadata"]["name"]: d for d in _render(replicas) if d["kind"] == "Deployment"}
    for name, budget in budgets.items():
        assert budget["apiVersion"] == "policy/v1"
        assert budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["selector"] == deployments[f"t-temporality-{name}"]["spec"]["selector"]
    budgets = _budgets(_merge(replicas, {"podDisruptionBudget": {"enabled": True, "maxUnavailable": "50%"}}))
    assert budgets["run-executor"]["spec"]["maxUnavailable"] == "50%"
    # the embedded NATS keeps its own (3 servers), beside the services'
    docs = _kinds(_render(_embedded(3, podDisruptionBudget={"enabled": True})))
    assert docs[("PodDisruptionBudget", NATS_NAME)]["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("kube", ["1.25.0", "latest"])
def test_the_rendered_pods_and_budgets_are_valid_kubernetes_objects(kube: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version() if kube == "latest" else kube
    values = _embedded(
        3,
        tolerations=[TOLERATION],
        affinity=NODE_AFFINITY,
        topologySpreadConstraints=[ZONE_SPREAD],
        podSecurityContext={"runAsUser": None, "fsGroupChangePolicy": "OnRootMismatch"},
        podDisruptionBudget={"enabled": True},
        services={"run-executor": {"replicas": 2}},
    )
    docs = [d for d in _render(values) if d["kind"] in ("Deployment", "StatefulSet", "Job", "PodDisruptionBudget")]
    assert {d["kind"] for d in docs} == {"Deployment", "StatefulSet", "Job", "PodDisruptionBudget"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_helm_lint_with_every_scheduling_setting() -> None:
    values = _embedded(
        3,
        tolerations=[TOLERATION],
        affinity=NODE_AFFINITY,
        topologySpreadConstraints=[ZONE_SPREAD],
        podDisruptionBudget={"enabled": True},
        services={"trigger-gateway": {"replicas": 2, "affinity": NODE_AFFINITY}},
    )
    report = _helm().lint(CHART, values, strict=True)
    assert not report["errors"], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]


@pytest.mark.parametrize(
    "extra",
    [
        {"tolerations": [TOLERATION]},
        {"services": {"run-executor": {"tolerations": [{"operator": "Exists"}]}}},
        {"affinity": NODE_AFFINITY},
        {"services": {"journal": {"topologySpreadConstraints": [ZONE_SPREAD]}}},
        {"nats": {"embedded": {"affinity": NODE_AFFINITY, "podSecurityContext": {"runAsUser": None}}}},
        {"podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None}},
        {"podDisruptionBudget": {"enabled": True, "maxUnavailable": "25%"}},
    ],
)
def test_the_values_schema_takes_the_settings(extra: dict[str, Any]) -> None:
    assert _values_errors(extra) == []


@pytest.mark.parametrize(
    "extra",
    [
        {"tolerations": [{"key": "a", "operator": "exists"}]},  # Exists or Equal
        {"tolerations": "dedicated=temporality:NoSchedule"},  # a list of objects, not kubectl's form
        {"affinity": {"nodeAfinity": {}}},  # typo
        {"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}]},  # which topologyKey?
        {"services": {"journal": {"toleration": []}}},
        {"podSecurityContext": {"runAsUser": "10001"}},
        {"podSecurityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},  # services.<name>.seccompProfile
        {"podDisruptionBudget": {"enabled": True, "maxUnavailable": "150%"}},
        {"podDisruptionBudget": {"enabled": True, "maxUnavailable": 0}},  # would block every drain
        {"nats": {"embedded": {"tolerations": [{"effect": "NoExecut"}]}}},
    ],
)
def test_the_values_schema_refuses_a_wrong_setting(extra: dict[str, Any]) -> None:
    assert _values_errors(extra)
