"""Issue 11: the durability and retention settings reach every service from compose and the chart, with the
defaults the services themselves have (``NatsSettings``), and the chart refuses values the services would not
start with. The embedded NATS's fsync (``nats.embedded.syncInterval``) is in tests/test_chart_nats_tls.py."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from test_deploy_files import ROOT, SERVICES, _compose_value, _deployments, _env, _render

from temporality_bus import NatsSettings

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
