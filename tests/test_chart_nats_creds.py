"""The chart's NATS credentials files (``nats.auth.credsSecret``): for an external NATS in operator/JWT mode, each
client of the chart logs in with its own ``.creds`` file (``TEMPORALITY_NATS_CREDS_FILE``) instead of a user and
password.

Rendered with the Helm SDK as tests/test_deploy_files.py does. What the services do with the file (nats-py's
user credentials, the refusal of a password beside it) is tested on real nats-servers in operator mode by
libs/bus/tests/test_nats_credentials.py and tests/test_nats_credentials_stack.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from test_deploy_files import CHART, SERVICES, _merge, _render, _validate

CREDS = {"nats": {"url": "nats://nats.example:4222", "auth": {"credsSecret": "temporality-nats-creds"}}}
CLIENTS = {*SERVICES, "timers-migrate", "tools"}


def _pods(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["spec"]
        for d in _render(values)
        if d["kind"] in ("Deployment", "Job")
    }


def test_every_client_mounts_its_own_credentials_file_and_no_password() -> None:
    pods = _pods(_merge(CREDS, {"tools": {"enabled": True}}))
    assert set(pods) == CLIENTS
    for name, pod in pods.items():
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["TEMPORALITY_NATS_CREDS_FILE"]["value"] == f"/etc/temporality/nats-creds/{name}.creds", name
        # the services refuse a password beside a credentials file (two ways to log in)
        assert not {"TEMPORALITY_NATS_USER", "TEMPORALITY_NATS_PASSWORD"} & set(env), name
        assert {"name": "nats-creds", "mountPath": "/etc/temporality/nats-creds", "readOnly": True} in container[
            "volumeMounts"
        ], name
        (volume,) = [v for v in pod["volumes"] if v["name"] == "nats-creds"]
        # only its own key of the Secret, readable by the pod's user only
        assert volume["secret"] == {
            "secretName": "temporality-nats-creds",
            "defaultMode": 0o400,
            "items": [{"key": f"{name}.creds", "path": f"{name}.creds"}],
        }, name


def test_without_it_the_pods_log_in_with_passwords_as_before() -> None:
    pods = _pods({"nats": {"auth": {"existingSecret": "nats-users"}}})
    for name, pod in pods.items():
        env = {e["name"] for e in pod["containers"][0]["env"]}
        assert "TEMPORALITY_NATS_CREDS_FILE" not in env, name
        assert {"TEMPORALITY_NATS_USER", "TEMPORALITY_NATS_PASSWORD"} <= env, name
        assert not [v for v in pod.get("volumes", []) if v["name"] == "nats-creds"], name


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            _merge(CREDS, {"nats": {"auth": {"existingSecret": "nats-users"}}}),
            "nats.auth.credsSecret and nats.auth.existingSecret are both set",
        ),
        (
            {"nats": {"embedded": {"enabled": True}, "auth": {"existingSecret": "u", "credsSecret": "c"}}},
            "nats.auth.credsSecret is for an external NATS",
        ),
    ],
)
def test_the_render_refuses_two_ways_to_log_in_and_the_embedded_nats(values: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=re.escape(message)):
        _render(values)


def test_the_values_schema_takes_a_secret_name() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert defaults["nats"]["auth"]["credsSecret"] == ""
    assert _validate(schema, _merge(defaults, CREDS)) == []
    assert _validate(schema, _merge(defaults, {"nats": {"auth": {"credsSecret": 3}}}))
