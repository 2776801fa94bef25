"""docker-compose's NATS exporter (profile ``metrics``; docs/operations.md#alerts) is the chart's sidecar for compose.

The exporter cannot run here (no container engine; what it reads from a real nats-server is checked by
tests/test_chart_nats_exporter.py), so this checks the model a real Docker Compose resolves: the service starts only
with its profile, runs the chart's pinned image with the chart's flags (so the chart's NATS alert expressions read
the same metric names), reads the compose NATS's monitoring port, and publishes its metrics on loopback only.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from test_deploy_files import CHART, _compose_config, _embedded, _merge, _render

EXPORTER = "nats-exporter"


def _model(env: dict[str, str] | None = None) -> dict[str, Any]:
    done = _compose_config(env)
    assert done.returncode == 0, done.stderr
    services: dict[str, Any] = json.loads(done.stdout)["services"]
    return services


def _sidecar_args() -> list[str]:
    values = _merge(_embedded(1), {"nats": {"embedded": {"exporter": {"enabled": True}}}})
    [pod] = [d for d in _render(values) if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("-nats")]
    [sidecar] = [c for c in pod["spec"]["template"]["spec"]["containers"] if c["name"] == "exporter"]
    args: list[str] = sidecar["args"]
    return args


def test_it_starts_only_with_the_metrics_profile() -> None:
    assert EXPORTER not in _model()
    assert EXPORTER in _model({"COMPOSE_PROFILES": "metrics"})


def test_it_is_the_chart_s_sidecar_reading_the_compose_nats() -> None:
    services = _model({"COMPOSE_PROFILES": "metrics"})
    exporter = services[EXPORTER]
    chart = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))["nats"]["embedded"]["exporter"]
    assert exporter["image"] == chart["image"], "one pinned release: the alerts read its metric names"

    command: list[str] = exporter["command"]
    flags = [a for a in command if a.startswith("-") and not a.startswith("-port=")]
    assert flags == [a for a in _sidecar_args() if a.startswith("-") and not a.startswith("-port=")]
    # the URL it reads is the compose NATS's monitoring port (nats -m <port>)
    nats_command: list[str] = services["nats"]["command"]
    monitor = nats_command[nats_command.index("-m") + 1]
    assert command[-1] == f"http://nats:{monitor}"
    assert exporter["depends_on"]["nats"]["condition"] == "service_healthy"

    # served on loopback only, on the port -port names
    [port] = exporter["ports"]
    listen = next(a for a in command if a.startswith("-port=")).removeprefix("-port=")
    assert (port["host_ip"], port["published"], str(port["target"])) == ("127.0.0.1", "7777", listen)
    assert exporter["read_only"] is True
    assert exporter["cap_drop"] == ["ALL"]


def test_its_host_port_is_a_variable() -> None:
    [port] = _model({"COMPOSE_PROFILES": "metrics", "NATS_EXPORTER_PORT": "9177"})[EXPORTER]["ports"]
    assert (port["host_ip"], port["published"]) == ("127.0.0.1", "9177")
