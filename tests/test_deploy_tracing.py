"""Tracing in the deploy files: compose passes the standard ``OTEL_*`` variables through, the chart's
``tracing`` values render them into every Deployment (and nothing while ``tracing.otlpEndpoint`` is empty)."""

from __future__ import annotations

import json
from copy import deepcopy
from typing import Any

import pytest
import yaml
from test_deploy_files import CHART, ROOT, _deployments, _validate

from temporality_protocol.catalog import SERVICES


def _env(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_compose_passes_the_otel_variables_to_every_service() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    for name in SERVICES:
        env = compose["services"][name]["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "${OTEL_EXPORTER_OTLP_ENDPOINT:-}", name  # unset: off
        assert env["OTEL_TRACES_SAMPLER"] == "${OTEL_TRACES_SAMPLER:-parentbased_always_on}", name


def test_the_chart_renders_no_tracing_variable_by_default() -> None:
    for name, deployment in _deployments().items():
        assert not [k for k in _env(deployment) if k.startswith("OTEL_")], name


def test_the_chart_renders_the_tracing_values_into_every_deployment() -> None:
    deployments = _deployments(
        {
            "tracing": {
                "otlpEndpoint": "http://otel-collector.observability:4318",
                "sampler": "parentbased_traceidratio",
                "samplerArg": "0.25",
                "resourceAttributes": "deployment.environment=prod",
                "headersSecret": {"name": "otlp-auth", "key": "headers"},
            }
        }
    )
    assert set(deployments) == set(SERVICES)
    for name, deployment in deployments.items():
        env = _env(deployment)
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
        assert env["OTEL_SERVICE_NAME"] == name
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
        assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert env["OTEL_RESOURCE_ATTRIBUTES"] == "deployment.environment=prod"
        assert env["OTEL_EXPORTER_OTLP_HEADERS"] == {"secretKeyRef": {"name": "otlp-auth", "key": "headers"}}


@pytest.mark.parametrize(
    ("key", "value"),
    [("otlpEndpoint", "otel-collector:4318"), ("sampler", "sometimes"), ("otlp_endpoint", "http://x:4318")],
)
def test_bad_tracing_values_fail(key: str, value: str) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    values_schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    broken = deepcopy(values)
    broken["tracing"][key] = value
    assert _validate(values_schema, broken)
    assert not _validate(values_schema, values)
