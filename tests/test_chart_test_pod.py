"""``helm test``'s pod (templates/tests/test-connection.yaml) takes its securityContext from ``tests.podSecurityContext``.

Rendered with the Helm SDK as tests/test_deploy_files.py does. Its user was fixed at 100 in the template, so on a
platform that assigns each namespace's user ids (OpenShift's ``restricted-v2`` SCC) ``helm test`` could not start the
pod while every other pod could be told to drop its fixed ids.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from test_deploy_files import CHART, _merge, _render, _validate


def _test_pod(values: dict[str, Any] | None = None) -> dict[str, Any]:
    [pod] = [d for d in _render(values) if d["kind"] == "Pod" and d["metadata"]["name"].endswith("-test-connection")]
    return pod


def _schema_errors(values: dict[str, Any]) -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return _validate(schema, _merge(defaults, values))


def test_by_default_it_runs_as_the_curl_image_s_user() -> None:
    assert _test_pod()["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 100,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_a_null_removes_the_fixed_user_as_for_the_other_pods() -> None:
    values = {"tests": {"podSecurityContext": {"runAsUser": None}}}
    assert _schema_errors(values) == []
    assert _test_pod(values)["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_the_schema_refuses_what_a_pod_security_context_cannot_hold() -> None:
    assert _schema_errors({"tests": {"podSecurityContext": {"runAsUser": "root"}}})
    assert _schema_errors({"tests": {"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}}})


def test_it_has_resources_the_pull_secrets_and_no_service_account_token() -> None:
    """A namespace with a ResourceQuota refuses a pod without resources; a registry mirror needs the pull secrets;
    curl needs no Kubernetes API token."""
    pod = _test_pod({"imagePullSecrets": [{"name": "regcred"}]})
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    [container] = pod["spec"]["containers"]
    assert container["resources"]["requests"] == {"cpu": "10m", "memory": "16Mi"}
    assert container["resources"]["limits"] == {"memory": "64Mi"}
    resources = {"requests": {"cpu": "5m", "memory": "8Mi"}, "limits": {"memory": "32Mi"}}
    assert _schema_errors({"tests": {"resources": resources}}) == []
    [container] = _test_pod({"tests": {"resources": resources}})["spec"]["containers"]
    assert container["resources"] == resources
    assert _schema_errors({"tests": {"resources": {"requests": {"cpu": "a lot"}}}})


def test_its_network_policy_is_a_test_hook_made_before_it() -> None:
    """In a namespace that denies all traffic by default the pod reaches DNS and the trigger-gateway's pods, on its
    port only, through a policy that comes and goes with `helm test` itself (not a release resource)."""
    docs = _render({"networkPolicy": {"enabled": True}})
    pod = _test_pod({"networkPolicy": {"enabled": True}})
    [policy] = [
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "t-temporality-test-connection"
    ]
    annotations = policy["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "test" == pod["metadata"]["annotations"]["helm.sh/hook"]
    assert int(annotations["helm.sh/hook-weight"]) < int(pod["metadata"]["annotations"].get("helm.sh/hook-weight", 0))
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["spec"]["ingress"] == []
    dns, gateway = policy["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert gateway["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert gateway["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "trigger-gateway"
    # the URL the pod curls is that port
    assert pod["spec"]["containers"][0]["command"][-1].endswith(":8080/healthz")
    assert not [d for d in _render() if d["kind"] == "NetworkPolicy"]
