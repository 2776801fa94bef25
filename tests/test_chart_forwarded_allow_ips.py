"""The chart's ``forwardedAllowIps``: the proxies (an ingress controller, a TLS proxy) whose ``X-Forwarded-For`` /
``-Proto`` every service believes, rendered as ``TEMPORALITY_FORWARDED_ALLOW_IPS`` into every service's container;
unset by default (the services then take the TCP peer as the client: docs/operations.md, "Behind an ingress or a
proxy"). The values schema refuses what is not an address or a network. Rendered with the Helm SDK, as
tests/test_deploy_files.py does, and the value checked by the services' own settings."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from test_deploy_files import CHART, SERVICES, _deployments, _validate

from temporality_service.settings import ProcessSettings

NAME = "TEMPORALITY_FORWARDED_ALLOW_IPS"


def _envs(values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    found = {}
    for name, deployment in _deployments(values).items():
        [container] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
        found[name] = {e["name"]: e.get("value") for e in container.get("env", [])}
    return found


def test_by_default_no_service_believes_forwarded_headers() -> None:
    envs = _envs()
    assert set(envs) == set(SERVICES)
    assert [name for name, env in envs.items() if NAME in env] == []


def test_the_proxies_listed_reach_every_service_as_one_setting() -> None:
    envs = _envs({"forwardedAllowIps": ["10.244.0.0/16", "192.0.2.10", "fd00::/8"]})
    assert {name: env.get(NAME) for name, env in envs.items()} == dict.fromkeys(
        SERVICES, "10.244.0.0/16,192.0.2.10,fd00::/8"
    )
    # what the services make of it: the same list, accepted
    assert ProcessSettings(forwarded_allow_ips=envs["journal"][NAME]).forwarded_allow_ips == envs["journal"][NAME]


def _schema_errors(value: Any) -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    values["forwardedAllowIps"] = value
    return _validate(schema, values)


@pytest.mark.parametrize("value", [[], ["10.0.0.5"], ["10.244.0.0/16", "::1"]])
def test_the_schema_takes_addresses_and_networks(value: list[str]) -> None:
    assert _schema_errors(value) == []


@pytest.mark.parametrize("value", ["10.0.0.5", ["ingress.local"], ["*"], [5]])
def test_the_schema_refuses_anything_else(value: Any) -> None:
    assert _schema_errors(value) != []
