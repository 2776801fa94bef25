"""The chart's seccomp profile per service (``services.<name>.seccompProfile``): ``RuntimeDefault`` unless set, so
the run-executor alone can get a profile that lets its MCP servers' ``sandbox.network: false`` unshare a user
namespace (docs/agents.md, "Network off"); the values schema refuses an incomplete or mistyped profile. Rendered
with the Helm SDK and checked against the Kubernetes API's schemas, as tests/test_deploy_files.py does."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from test_deploy_files import CHART, SERVICES, _deployments, _validate

LOCALHOST = {"type": "Localhost", "localhostProfile": "profiles/temporality-userns.json"}


def _profiles(values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    return {
        name: d["spec"]["template"]["spec"]["securityContext"]["seccompProfile"]
        for name, d in _deployments(values).items()
    }


def _values_errors(services: dict[str, Any]) -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    for name, extra in services.items():
        values["services"][name].update(extra)
    return _validate(schema, values)


def test_every_service_runs_runtime_default_unless_its_profile_is_set() -> None:
    assert _profiles() == {key: {"type": "RuntimeDefault"} for key in SERVICES}
    profiles = _profiles({"services": {"run-executor": {"seccompProfile": LOCALHOST}}})
    assert profiles.pop("run-executor") == LOCALHOST
    assert profiles == {key: {"type": "RuntimeDefault"} for key in set(SERVICES) - {"run-executor"}}


def test_the_rendered_deployment_with_a_localhost_profile_is_a_valid_kubernetes_object() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = _deployments({"services": {"run-executor": {"seccompProfile": LOCALHOST}}})["run-executor"]
    for kube in ("1.25.0", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(deployment, kube, strict=True)


def test_the_values_schema_takes_a_profile_and_refuses_a_wrong_one() -> None:
    assert (
        _values_errors(
            {"run-executor": {"seccompProfile": LOCALHOST}, "journal": {"seccompProfile": {"type": "Unconfined"}}}
        )
        == []
    )
    assert _values_errors({"run-executor": {"seccompProfile": {"type": "Localhost"}}})  # which file?
    assert _values_errors(
        {"run-executor": {"seccompProfile": {"type": "RuntimeDefault", "localhostProfile": "x.json"}}}
    )
    assert _values_errors({"run-executor": {"seccompProfile": {"type": "runtimedefault"}}})
    assert _values_errors({"run-executor": {"seccompProfile": {"type": "Unconfined", "profile": "x"}}})
