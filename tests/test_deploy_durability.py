"""Issue 11: the durability and retention settings reach every service from compose and the chart, with the
defaults the services themselves have (``NatsSettings``), and the chart refuses values the services would not
start with. The embedded NATS's fsync (``nats.embedded.syncInterval``) is in tests/test_chart_nats_tls.py; compose's
nats-server fsync (``NATS_SYNC_INTERVAL``) is here, run on a real nats-server with the compose file's config."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_files import COMPOSE_NATS_CONF, ROOT, SERVICES, _compose_value, _deployments, _env, _render

from temporality_bus import NatsSettings
from temporality_embedded.natsserver import NatsServer

#: The settings of durability and retention every service is given, and the value names of the chart's.
SETTINGS = {
    "TEMPORALITY_NATS_STREAM_REPLICAS": "streamReplicas",
    "TEMPORALITY_NATS_EVENTS_MAX_AGE_DAYS": "eventsMaxAgeDays",
    "TEMPORALITY_NATS_DLQ_MAX_AGE_DAYS": "dlqMaxAgeDays",
}


def _defaults() -> NatsSettings:
    """The services' own defaults (not this test process's environment: the suite runs ``claimed``)."""
    return NatsSettings.model_construct(**{k: f.get_default() for k, f in NatsSettings.model_fields.items()})


def _settings(env: dict[str, str]) -> NatsSettings:
    """What a service makes of ``env`` (only the ``TEMPORALITY_NATS_*`` of it)."""
    fields = {
        k.removeprefix("TEMPORALITY_NATS_").lower(): v for k, v in env.items() if k.startswith("TEMPORALITY_NATS_")
    }
    known = {k: v for k, v in fields.items() if k in NatsSettings.model_fields}
    return NatsSettings.model_validate({"source_check": _defaults().source_check, **known})


def test_compose_gives_every_service_the_settings_with_the_services_defaults() -> None:
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    defaults = _defaults()
    for name in SERVICES:
        env = {k: _compose_value(v) for k, v in _env(compose["services"][name]).items()}
        assert set(SETTINGS) | {"TEMPORALITY_NATS_SOURCE_CHECK"} <= set(env), name
        settings = _settings(env)
        assert settings.stream_replicas == defaults.stream_replicas == 1
        assert settings.events_max_age_days == defaults.events_max_age_days
        assert settings.dlq_max_age_days == defaults.dlq_max_age_days
        assert settings.source_check == defaults.source_check == "strict"
        for variable in SETTINGS:  # each from the shell or ./.env
            assert _env(compose["services"][name])[variable].startswith(f"${{{variable}:-"), (name, variable)


def test_the_chart_gives_every_service_the_settings_it_is_given() -> None:
    defaults = _defaults()
    for name, deployment in _deployments().items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        settings = _settings(env)
        assert settings.dlq_max_age_days == defaults.dlq_max_age_days, name
        assert settings.events_max_age_days == defaults.events_max_age_days, name
        assert settings.stream_replicas == defaults.stream_replicas, name
    values = {"nats": {"streamReplicas": 3, "eventsMaxAgeDays": 14, "dlqMaxAgeDays": 0}}
    for name, deployment in _deployments(values).items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        settings = _settings({e["name"]: e["value"] for e in container["env"] if "value" in e})
        assert (settings.stream_replicas, settings.events_max_age_days, settings.dlq_max_age_days) == (3, 14, 0), name


@pytest.mark.parametrize(
    "nats",
    [{"dlqMaxAgeDays": -1}, {"eventsMaxAgeDays": -2}, {"streamReplicas": 0}, {"dlqMaxAgeDays": "a month"}],
    ids=["dlq-negative", "events-negative", "no-replicas", "dlq-text"],
)
def test_the_chart_refuses_a_value_the_services_would_refuse(nats: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="nats"):
        _render({"nats": nats})


# --------------------------------------------------------------------------- compose's nats-server fsync
_INTERPOLATED = re.compile(r"\$\{([A-Z0-9_]+):-([^}]*)\}")


def _interpolate(value: str, shell: dict[str, str]) -> str:
    """A compose value as compose makes it from ``shell`` (your shell or ./.env): ``${VAR:-default}`` is VAR's
    value, or the default when VAR is unset or empty."""
    return _INTERPOLATED.sub(lambda m: shell.get(m[1]) or m[2], value)


def _compose_nats() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    nats: dict[str, Any] = compose["services"]["nats"]
    return nats


def test_compose_nats_fsync_comes_from_the_environment_quoted_for_the_server() -> None:
    """``NATS_SYNC_INTERVAL`` (default ``2m``, the server's own) reaches the config compose's nats-server runs,
    quoted: a bare ``2m`` is the number 2,000,000 to nats-server's config parser (seconds: 23 days)."""
    assert _env(_compose_nats())["NATS_SYNC_INTERVAL"] == '"${NATS_SYNC_INTERVAL:-2m}"'
    assert re.search(r"^jetstream \{\n  sync_interval: \$NATS_SYNC_INTERVAL\n\}$", COMPOSE_NATS_CONF.read_text(), re.M)


def _jetstream_config(server: NatsServer) -> dict[str, Any]:
    with urllib.request.urlopen(f"{server.monitoring_url}/varz", timeout=10) as answer:
        config: dict[str, Any] = json.load(answer)["jetstream"]["config"]
    return config


@pytest.mark.parametrize(
    ("shell", "interval_s", "always"),
    [
        ({}, 120, False),
        ({"NATS_SYNC_INTERVAL": ""}, 120, False),
        ({"NATS_SYNC_INTERVAL": "2m"}, 120, False),
        ({"NATS_SYNC_INTERVAL": "10s"}, 10, False),
        ({"NATS_SYNC_INTERVAL": "always"}, None, True),
    ],
    ids=["unset", "empty", "2m", "10s", "always"],
)
def test_compose_nats_runs_with_the_fsync_it_is_given(
    shell: dict[str, str], interval_s: int | None, always: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Docker here: the wheel's nats-server runs the compose file's config with the nats service's environment
    as compose makes it from ``shell``, and says (``/varz``) which fsync it applies."""
    for variable, value in _env(_compose_nats()).items():
        monkeypatch.setenv(variable, _interpolate(value, shell))
    server = NatsServer(tmp_path / "nats", config_file=COMPOSE_NATS_CONF, monitoring=True)
    server.start()
    try:
        config = _jetstream_config(server)
    finally:
        server.stop()
    assert bool(config.get("sync_always")) is always
    if interval_s is not None:
        assert config["sync_interval"] == interval_s * 10**9


def test_compose_nats_refuses_to_start_with_an_fsync_it_cannot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable, value in _env(_compose_nats()).items():
        monkeypatch.setenv(variable, _interpolate(value, {"NATS_SYNC_INTERVAL": "sometimes"}))
    server = NatsServer(tmp_path / "nats", config_file=COMPOSE_NATS_CONF, log_file=tmp_path / "nats.log")
    with pytest.raises(RuntimeError, match="nats-server exited"):
        server.start()
