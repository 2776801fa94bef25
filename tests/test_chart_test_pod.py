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
